"""``python -m bench.tools.temporal_profile [signal|fanout|seq3|paired] [--runs N]``: where the
time of bench workload 5 (signal round trip), 3 (fan-out 1 -> 50 -> 1) or 1 and 2 (the 3-stage
workflow of latency and throughput) goes, on the Temporal driver and on the hand-written
temporalio workflow; ``paired`` times latency, fan-out and signal on both in alternation.

Each side gets its own dev server and an in-process worker. ``signal``: for N runs parked in
their signal wait, the sender's two calls timed apart (``engine.signal`` / ``handle.signal``
returning, then the result), and the event history of the last run with milliseconds since
the signal was recorded. ``fanout``/``seq3``: N runs, and what the last run's history holds (events,
workflow tasks and the time spent in them, activities, local-activity markers)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from datetime import UTC
from typing import Any

from temporalio.api.enums.v1 import EventType

from driver_temporal import TemporalDevServer, TemporalEngine
from engine_port import EngineSettings, create_engine

from .. import _temporal_raw as R
from .. import _workflows as W
from .._common import Sizes
from .._native import _until_waiting
from ._temporal_engine import driver_engine

PAUSE_S = Sizes.full(slow=True).pause_s


def _print_history(title: str, history: Any) -> None:
    signalled = next(
        e.event_time.ToDatetime()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    )
    print(f"\n{title}: {len(history.events)} events; ms since the signal was recorded")
    for e in history.events:
        at = (e.event_time.ToDatetime() - signalled).total_seconds() * 1000
        if at < 0:
            continue
        name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        detail = ""
        if e.HasField("activity_task_scheduled_event_attributes"):
            detail = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.HasField("marker_recorded_event_attributes"):
            detail = e.marker_recorded_event_attributes.marker_name
        elif e.HasField("workflow_execution_update_accepted_event_attributes"):
            a = e.workflow_execution_update_accepted_event_attributes
            detail = a.accepted_request.input.name
        print(f"{at:8.1f}  {name} {detail}")


def _summary(title: str, history: Any) -> None:
    """What a history holds, and where its workflow tasks spent their time."""
    events = history.events
    t = {e.event_id: e.event_time.ToDatetime() for e in events}
    kinds = [e.event_type for e in events]
    wft_wait = wft_run = 0.0
    for e in events:
        if e.HasField("workflow_task_started_event_attributes"):
            sched = e.workflow_task_started_event_attributes.scheduled_event_id
            wft_wait += (t[e.event_id] - t[sched]).total_seconds() * 1000
        if e.HasField("workflow_task_completed_event_attributes"):
            started = e.workflow_task_completed_event_attributes.started_event_id
            wft_run += (t[e.event_id] - t[started]).total_seconds() * 1000
    wfts = kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    wall = (t[events[-1].event_id] - t[events[0].event_id]).total_seconds() * 1000
    print(
        f"{title}: {len(events)} events, {wall:.0f} ms first to last; {wfts} workflow tasks "
        f"(scheduled->started {wft_wait:.0f} ms in all, started->completed {wft_run:.0f} ms); "
        f"{kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)} activities; "
        f"{kinds.count(EventType.EVENT_TYPE_MARKER_RECORDED)} markers (local activities)"
    )


def _p50(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f}"


async def driver(runs: int, workload: str) -> None:
    async with driver_engine() as (engine, _server):
        if workload in ("fanout", "seq3"):
            wf = "bench-fanout-50" if workload == "fanout" else "bench-seq3"
            times, starts, ends = [], [], []
            for _ in range(runs + 1):  # (the first one warms up)
                t0 = time.time()
                run = await engine.start(wf, {})
                await engine.wait(run.id, timeout=300)
                t2 = time.time()
                times.append((t2 - t0) * 1000)
                handle = engine._conn.get_workflow_handle(run.id)
                history = await handle.fetch_history()
                first = history.events[0].event_time.ToDatetime(UTC).timestamp()
                last = history.events[-1].event_time.ToDatetime(UTC).timestamp()
                starts.append((first - t0) * 1000)
                ends.append((t2 - last) * 1000)
            print(
                f"driver: {workload} p50 {_p50(times[1:])} ms over {runs} runs; "
                f"start() call -> history's first event {_p50(starts[1:])} ms, "
                f"history's last event -> wait() returned {_p50(ends[1:])} ms (p50s)"
            )
            _summary("driver, last run", history)
            return
        sent, done = [], []
        for _ in range(runs):
            run = await engine.start("bench-signal", {})
            await _until_waiting(engine, run.id)
            t0 = time.perf_counter()
            await engine.signal(run.id, "go", {"ok": True})
            t1 = time.perf_counter()
            await engine.wait(run.id, timeout=60)
            t2 = time.perf_counter()
            sent.append((t1 - t0) * 1000)
            done.append((t2 - t0) * 1000)
        print(
            f"driver: signal() returned after {_p50(sent)} ms (p50), "
            f"wait() after {_p50(done)} ms, over {runs} runs"
        )
        handle = engine._conn.get_workflow_handle(run.id)
        history = await handle.fetch_history()
        _print_history("driver, last run", history)
        _summary("driver, last run", history)


async def hand_written(runs: int, workload: str) -> None:
    async with TemporalDevServer(headless=True) as server, R.worker(server.address) as client:
        if workload in ("fanout", "seq3"):
            wf, arg = ("bench_fanout", 50) if workload == "fanout" else ("bench_seq3", False)
            times = []
            for _ in range(runs + 1):
                t0 = time.perf_counter()
                handle = await client.start_workflow(
                    wf, arg, id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
                )
                await handle.result()
                times.append((time.perf_counter() - t0) * 1000)
            print(f"hand-written: {workload} p50 {_p50(times[1:])} ms over {runs} runs")
            _summary("hand-written, last run", await handle.fetch_history())
            return
        sent, done = [], []
        for _ in range(runs):
            handle = await client.start_workflow(
                "bench_signal", id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
            )
            await handle.query("waiting")
            t0 = time.perf_counter()
            await handle.signal("go", {"ok": True})
            t1 = time.perf_counter()
            await handle.result()
            t2 = time.perf_counter()
            sent.append((t1 - t0) * 1000)
            done.append((t2 - t0) * 1000)
        print(
            f"hand-written: signal() returned after {_p50(sent)} ms (p50), "
            f"result after {_p50(done)} ms, over {runs} runs"
        )
        history = await handle.fetch_history()
        _print_history("hand-written, last run", history)
        _summary("hand-written, last run", history)


async def paired(rounds: int) -> None:
    """Driver and hand-written side by side in one process (each on its own dev server),
    one run of each per round, alternating which goes first, each after the bench's pause:
    the machine's load drifts between the bench's systems, measured minutes apart; here
    both see the same load."""
    with tempfile.TemporaryDirectory() as d:
        async with (
            TemporalDevServer(headless=True) as ours,
            TemporalDevServer(headless=True) as theirs,
        ):
            settings = EngineSettings(
                driver="temporal",
                temporal_address=ours.address,
                blob_url=f"file://{d}/blobs",
                task_queue="bench",
            )
            async with (
                create_engine(settings, W.registry()) as engine,
                engine.worker(),
                R.worker(theirs.address) as client,
            ):
                assert isinstance(engine, TemporalEngine)
                last: dict[str, Any] = {}  # each side's last handle

                async def run_driver(wf: str) -> float:
                    t0 = time.perf_counter()
                    run = await engine.start(wf, {})
                    await engine.wait(run.id, timeout=300)
                    last["driver"] = engine._conn.get_workflow_handle(run.id)
                    return (time.perf_counter() - t0) * 1000

                async def run_raw(wf: str, arg: Any) -> float:
                    t0 = time.perf_counter()
                    last["raw"] = await client.start_workflow(
                        wf, arg, id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
                    )
                    await last["raw"].result()
                    return (time.perf_counter() - t0) * 1000

                async def signal_driver() -> float:
                    run = await engine.start("bench-signal", {})
                    await _until_waiting(engine, run.id)
                    await asyncio.sleep(PAUSE_S)
                    t0 = time.perf_counter()
                    await engine.signal(run.id, "go", {"ok": True})
                    await engine.wait(run.id, timeout=60)
                    return (time.perf_counter() - t0) * 1000

                async def signal_raw() -> float:
                    handle = await client.start_workflow(
                        "bench_signal", id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
                    )
                    await handle.query("waiting")
                    await asyncio.sleep(PAUSE_S)
                    t0 = time.perf_counter()
                    await handle.signal("go", {"ok": True})
                    await handle.result()
                    return (time.perf_counter() - t0) * 1000

                pairs: dict[str, tuple[Any, Any]] = {
                    "3-stage latency": (
                        lambda: run_driver("bench-seq3"),
                        lambda: run_raw("bench_seq3", False),
                    ),
                    "fan-out 1->50->1": (
                        lambda: run_driver("bench-fanout-50"),
                        lambda: run_raw("bench_fanout", 50),
                    ),
                    "signal round trip": (signal_driver, signal_raw),
                }
                print(f"paired, {rounds} rounds each (ms p50s; ratio = driver / hand-written)")
                for name, (a, b) in pairs.items():
                    for _ in range(2):  # warm-up
                        await a()
                        await b()
                    da, db, ratios = [], [], []

                    async def after_pause(fn: Any) -> float:
                        await asyncio.sleep(PAUSE_S)  # (as the bench: not back to back)
                        x: float = await fn()
                        return x

                    for i in range(rounds):
                        if i % 2:
                            y, x = await after_pause(b), await after_pause(a)
                        else:
                            x, y = await after_pause(a), await after_pause(b)
                        da.append(x)
                        db.append(y)
                        ratios.append(x / y)
                    print(
                        f"{name}: driver {_p50(da)}, hand-written {_p50(db)}, ratio of p50s "
                        f"{statistics.median(da) / statistics.median(db):.2f}, p50 of the "
                        f"per-round ratios {statistics.median(ratios):.2f}"
                    )
                    if name == "3-stage latency":
                        for side in ("driver", "raw"):
                            history = await last[side].fetch_history()
                            _summary(f"  {side}, last run", history)


async def main(workload: str, runs: int) -> None:
    if workload == "paired":
        await paired(runs)
        return
    await driver(runs, workload)
    print()
    await hand_written(runs, workload)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "workload", nargs="?", choices=["signal", "fanout", "seq3", "paired"], default="signal"
    )
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    asyncio.run(main(args.workload, args.runs))
