"""``python -m bench.tools.temporal_history [--local | --signal | --signal-body]``: run the
bench's 3-stage workflow on the Temporal driver (own dev server, in-process worker), print the
p50 latency and the event history of the last run with milliseconds since it started (workflow
task and activity timings), then the history size against the same workflow written by hand
(``bench/_temporal_raw.py``): issue 13's goal is at most 1.5x the hand-written event count.
``--signal``: the signal round trip instead (``bench-signal``: a stage that starts on ``go``
and returns it, against ``bench_signal``, which waits in the workflow and hands it to an
activity); ``--signal-body``: the same with the wait inside the stage body
(``bench-signal-body``, the shape of ``bench-signal`` until 2026-12-06).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from temporalio.api.enums.v1 import EventType

from engine_port import RunStatus

from .. import _temporal_raw as raw
from ._temporal_engine import driver_engine


async def _signalled(engine: Any, wf: str = "bench-signal") -> Any:
    """A bench-signal run, from its start to its end: parked, then signalled ``go``."""
    run = await engine.start(wf, {})
    deadline = time.monotonic() + 30
    while (await engine.get_run(run.id)).status != RunStatus.SUSPENDED:
        if time.monotonic() > deadline:
            raise RuntimeError("the bench-signal run never parked in its wait")
        await asyncio.sleep(0.01)
    await engine.signal(run.id, "go", {"ok": True})
    await engine.wait(run.id, timeout=60)
    return run


async def _hand_signalled(client: Any) -> Any:
    handle = await client.start_workflow(
        "bench_signal", id=f"hand-{uuid.uuid4().hex}", task_queue=raw.TASK_QUEUE
    )
    await handle.query("waiting")
    await handle.signal("go", {"ok": True})
    await handle.result()
    return handle


async def main(local: bool, runs: int, signal: str | None = None) -> None:
    wf = "bench-seq3-local" if local else "bench-seq3"
    async with driver_engine() as (engine, server):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            if signal:
                run = await _signalled(engine, signal)
            else:
                run = await engine.start(wf, {})
                await engine.wait(run.id, timeout=60)
            times.append((time.perf_counter() - t0) * 1000)
        print(f"p50 {statistics.median(times[5:] or times):.1f} ms over {runs} runs")
        history = await engine._conn.get_workflow_handle(run.id).fetch_history()
        first = history.events[0].event_time.ToDatetime()
        for e in history.events:
            at = (e.event_time.ToDatetime() - first).total_seconds() * 1000
            name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
            print(f"{at:8.1f}  {e.ByteSize():6d} B  {name}")
        async with raw.worker(server.address) as client:
            if signal:
                handle = await _hand_signalled(client)
            else:
                handle = await client.start_workflow(
                    "bench_seq3", local, id=f"hand-{uuid.uuid4().hex}", task_queue=raw.TASK_QUEUE
                )
                await handle.result()
            hand = len((await handle.fetch_history()).events)
        ours = len(history.events)
        print(f"history: {ours} events, hand-written {hand}: {ours / hand:.2f}x (goal 1.5x)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--local", action="store_true", help="the local=True stages variant")
    ap.add_argument(
        "--signal",
        action="store_const",
        const="bench-signal",
        help="the signal round trip instead (a stage that starts on the signal)",
    )
    ap.add_argument(
        "--signal-body",
        dest="signal",
        action="store_const",
        const="bench-signal-body",
        help="the signal round trip, the wait inside the stage body",
    )
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    asyncio.run(main(args.local, args.runs, args.signal))
