"""``python -m bench.tools.temporal_cpu seq3|local|fanout [--runs N] [--settle S]``: CPU
seconds per run of the Temporal driver and of the same workflow written by hand with temporalio,
each on its own dev server with an in-process worker: the client-and-worker process
(``time.process_time``, every thread) and the dev server (its ``/proc`` user + system time),
then the last run's history (events, bytes). Runs go one at a time with a 0.3 s pause, so these
counts depend far less on the machine's load than latencies do (the p50 is printed for
reference only).

Counting starts ``--settle`` seconds (default 15) after the worker started: the driver's worker
start sets up a Worker Deployment per served workflow version, and the dev server works on that
in the background for several seconds (~120 ms CPU per second in the first 5 s, 6-8 ms after;
hand-written: 38, then 2-4). Counted from the start, that work landed in the driver's per-run
figure (a 3-stage local=True run: 42 ms of server CPU counted at once, 26-27 ms settled).

The process CPU is also split by thread (``/proc/self/task``, grouped by thread name):
``python`` is the asyncio loop (client calls, activities, the SDK's activation handling),
``workflow-proces...`` the thread pool that runs workflow activations, ``tokio-rt-worker`` the
SDK core (Rust: gRPC, history processing)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from driver_temporal import TemporalDevServer

from .. import _temporal_raw as raw
from ._temporal_engine import driver_engine

_WARMUP = 3
_DRIVER = {"seq3": "bench-seq3", "local": "bench-seq3-local", "fanout": "bench-fanout-50"}
_RAW: dict[str, tuple[str, Any]] = {
    "seq3": ("bench_seq3", False),
    "local": ("bench_seq3", True),
    "fanout": ("bench_fanout", 50),
}


def _threads_cpu() -> dict[str, tuple[str, float]]:
    """CPU seconds so far of each thread of this process: {tid: (name, seconds)}."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def _server_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(
    title: str, pid: int, runs: int, one: Callable[[], Awaitable[Any]], settle: float
) -> tuple[Any, str]:
    """Run ``one`` (returns a workflow handle) ``runs`` times after ``settle`` seconds and the
    warm-ups."""
    times: list[float] = []
    c0 = s0 = 0.0
    th0: dict[str, tuple[str, float]] = {}
    handle: Any = None
    await asyncio.sleep(settle)
    for i in range(runs + _WARMUP):
        if i == _WARMUP:
            c0, s0, th0 = time.process_time(), _server_cpu(pid), _threads_cpu()
        t0 = time.perf_counter()
        handle = await one()
        if i >= _WARMUP:
            times.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.3)
    c1, s1 = time.process_time(), _server_cpu(pid)
    per_thread: dict[str, float] = {}
    for tid, (name, cpu) in _threads_cpu().items():
        per_thread[name] = per_thread.get(name, 0.0) + cpu - th0.get(tid, (name, 0.0))[1]
    threads = ", ".join(
        f"{name} {cpu / runs * 1000:.1f}"
        for name, cpu in sorted(per_thread.items(), key=lambda kv: -kv[1])
        if cpu > 0
    )
    events = (await handle.fetch_history()).events
    size = sum(e.ByteSize() for e in events)
    return handle, (
        f"{title}: process CPU {(c1 - c0) / runs * 1000:.1f} ms/run, dev server CPU "
        f"{(s1 - s0) / runs * 1000:.1f} ms/run, history {len(events)} events / {size} bytes, "
        f"p50 {statistics.median(times):.1f} ms ({runs} runs)\n    process CPU by thread, "
        f"ms/run: {threads}"
    )


async def driver(workload: str, runs: int, settle: float) -> str:
    async with driver_engine() as (engine, server):
        conn = engine._conn  # type: ignore[attr-defined]

        async def one() -> Any:
            run = await engine.start(_DRIVER[workload], {})
            await engine.wait(run.id, timeout=300)
            return conn.get_workflow_handle(run.id)

        assert server._proc is not None
        _, line = await _measure("driver", server._proc.pid, runs, one, settle)
        return line


async def hand_written(workload: str, runs: int, settle: float) -> str:
    wf, arg = _RAW[workload]
    async with TemporalDevServer(headless=True) as server, raw.worker(server.address) as client:

        async def one() -> Any:
            handle = await client.start_workflow(
                wf, arg, id=uuid.uuid4().hex, task_queue=raw.TASK_QUEUE
            )
            await handle.result()
            return handle

        assert server._proc is not None
        _, line = await _measure("hand-written", server._proc.pid, runs, one, settle)
        return line


async def main(workload: str, runs: int, settle: float) -> None:
    print(f"{workload}:")
    print("  " + await driver(workload, runs, settle))
    print("  " + await hand_written(workload, runs, settle))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("workload", choices=sorted(_DRIVER))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument(
        "--settle",
        type=float,
        default=15.0,
        help="seconds to wait after the worker started before counting (default 15)",
    )
    args = ap.parse_args()
    asyncio.run(main(args.workload, args.runs, args.settle))
