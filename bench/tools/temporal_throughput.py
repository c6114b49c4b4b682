"""``python -m bench.tools.temporal_throughput [--runs N] [--rounds R] [--warm N]``: the
bench's Temporal throughput workload (3-stage runs started 50 at a time, two worker processes),
the driver and hand-written temporalio alternated round by round so the machine's load falls on
both alike, each round on a fresh dev server. Prints runs/s and the CPU per run of each part of
the process tree: the dev server, the two worker processes, and this (starting) process.

``--warm N`` first runs N 3-stage runs one at a time with an in-process worker on the same dev
server (as the bench's throughput row does for the driver, after its latency workloads), to
see whether a used dev server changes the figure.

``--pinned``: hand-written temporalio against itself with Worker Deployment versioning, its
workflows pinned to their version (``PinnedVersioningOverride`` at the start), as the driver
pins every run to its definition version: what that pinning alone costs, in place of the
driver's rounds."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from typing import Any

from driver_temporal import TemporalDevServer

from .. import _temporal_raw as raw
from .._common import Sizes
from .._temporal import _gather_bounded
from ._temporal_engine import driver_engine

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int | str) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _pid(server: TemporalDevServer) -> int:
    assert server._proc is not None
    return server._proc.pid


def _workers() -> list[int]:
    """The pids of this process's ``bench._procs`` worker processes."""
    me = str(os.getpid())
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == me and b"bench._procs" in cmd:
            out.append(int(pid))
    return out


async def _timed(server_pid: int, go: Any, n: int) -> dict[str, float]:
    w = _workers()
    s0, w0, c0 = _cpu(server_pid), sum(_cpu(p) for p in w), time.process_time()
    t0 = time.perf_counter()
    await go()
    dt = time.perf_counter() - t0
    s1, w1, c1 = _cpu(server_pid), sum(_cpu(p) for p in w), time.process_time()
    return {
        "runs_per_s": n / dt,
        "server_ms": (s1 - s0) / n * 1000,
        "workers_ms": (w1 - w0) / n * 1000,
        "client_ms": (c1 - c0) / n * 1000,
    }


async def _driver(n: int, warm: int, settle: float) -> dict[str, float]:
    from bench._procs import worker_processes

    async with driver_engine(worker=False) as (engine, server):
        if warm:
            async with engine.worker():
                for _ in range(warm):
                    run = await engine.start("bench-seq3", {})
                    await engine.wait(run.id, timeout=60)
        args = {"address": server.address, "blobs": engine.settings.blob_url.reveal()}
        async with worker_processes("temporal-driver", args):
            await asyncio.sleep(settle)

            async def go() -> None:
                runs = await _gather_bounded(n, 50, lambda _i: engine.start("bench-seq3", {}))
                await _gather_bounded(n, 100, lambda i: engine.wait(runs[i].id, timeout=600))

            return await _timed(_pid(server), go, n)


async def _raw(n: int, settle: float, *, pinned: bool = False) -> dict[str, float]:
    from temporalio.client import Client
    from temporalio.common import PinnedVersioningOverride, WorkerDeploymentVersion

    from bench._procs import worker_processes

    pin = PinnedVersioningOverride(WorkerDeploymentVersion(*raw.PINNED)) if pinned else None
    async with TemporalDevServer(headless=True) as server:
        client = await Client.connect(server.address)
        args = {"address": server.address, "pinned": pinned}
        async with worker_processes("temporal-raw", args):
            await asyncio.sleep(settle)

            async def go() -> None:
                handles = await _gather_bounded(
                    n,
                    50,
                    lambda _i: client.start_workflow(
                        "bench_seq3",
                        False,
                        id=uuid.uuid4().hex,
                        task_queue=raw.TASK_QUEUE,
                        versioning_override=pin,
                    ),
                )
                await _gather_bounded(n, 100, lambda i: handles[i].result())

            return await _timed(_pid(server), go, n)


def _line(title: str, rows: list[dict[str, float]]) -> str:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    each = " / ".join(f"{r['runs_per_s']:.1f}" for r in rows)
    return (
        f"{title}: {med['runs_per_s']:.1f} runs/s ({each}); CPU per run: server "
        f"{med['server_ms']:.1f}, workers {med['workers_ms']:.1f}, client {med['client_ms']:.1f} ms"
    )


async def main(runs: int, rounds: int, warm: int, settle: float, pinned: bool) -> None:
    name = "pinned" if pinned else "driver"
    drv: list[dict[str, float]] = []
    hand: list[dict[str, float]] = []
    for i in range(rounds):
        order = (name, "raw") if i % 2 == 0 else ("raw", name)
        for which in order:
            if which == "raw":
                hand.append(await _raw(runs, settle))
                print("raw   ", {k: round(v, 1) for k, v in hand[-1].items()}, flush=True)
                continue
            if pinned:
                drv.append(await _raw(runs, settle, pinned=True))
            else:
                drv.append(await _driver(runs, warm, settle))
            print(name, {k: round(v, 1) for k, v in drv[-1].items()}, flush=True)
    print(_line(f"{'hand-written, pinned' if pinned else 'driver':<20}", drv))
    print(_line(f"{'hand-written':<20}", hand))
    ratios = [h["runs_per_s"] / d["runs_per_s"] for d, h in zip(drv, hand, strict=True)]
    print(
        f"ratio (hand-written runs/s / {name} runs/s) per round:",
        [round(r, 2) for r in ratios],
        f"median {statistics.median(ratios):.2f}",
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=Sizes.throughput_runs)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warm", type=int, default=0)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--pinned", action="store_true", help="hand-written pinned, not the driver")
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.rounds, args.warm, args.settle, args.pinned))
