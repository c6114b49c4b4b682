"""Time at its edges on the native driver (SQLite and PostgreSQL): many runs sleeping until
one instant all wake, none lost; a sleep whose deadline passes while no worker is up wakes
once when a worker comes back."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from conformance._trace import normalise
from engine_port import MemorySink, RunStatus, StageContext, Workflow

from .conftest import MakeEngine, eventually


def _check_trace(events: list[Any], wf: Workflow[Any]) -> list[list[Any]]:
    trace = normalise(events, wf.graph())
    started = Counter(tuple(t) for t in trace if t[0] == "stage.started")
    assert all(n == 1 for n in started.values()), trace
    return trace


async def test_two_hundred_runs_sleeping_until_one_instant_all_wake(
    make_engine: MakeEngine,
) -> None:
    from pydantic import BaseModel

    class At(BaseModel):
        at: str

    wf = Workflow("herd", input=At)
    woke: dict[str, float] = {}

    @wf.stage
    async def nap(ctx: StageContext[At]) -> str:
        target = datetime.fromisoformat(ctx.input.at)
        await ctx.step.sleep("nap", max(target - datetime.now(UTC), timedelta(0)))
        woke.setdefault(ctx.run_id, time.time())
        return "woke"

    sink = MemorySink()
    engine = await make_engine(wf, event_sink=sink)
    target = datetime.now(UTC) + timedelta(seconds=6)
    async with engine.worker():
        runs = [await engine.start(wf, {"at": target.isoformat()}) for _ in range(200)]
        started_all = datetime.now(UTC)
        assert started_all < target, "starting 200 runs took longer than the sleep"
        infos = [await engine.wait(r.id, timeout=120) for r in runs]
    assert all(i.status == RunStatus.COMPLETED for i in infos), Counter(i.status for i in infos)
    late = max(woke.values()) - target.timestamp()
    assert min(woke.values()) >= target.timestamp() - 0.05  # none woke early
    assert late < 30, f"the last of 200 runs woke {late:.2f}s past their deadline"
    for r in runs:
        trace = _check_trace(sink.for_run(r.id), wf)
        assert [t[0] for t in trace].count("stage.suspended") == 1


async def test_a_sleep_past_its_deadline_without_a_worker_wakes_once(
    make_engine: MakeEngine,
) -> None:
    from pydantic import BaseModel

    class Nothing(BaseModel):
        pass

    wf = Workflow("restart-nap", input=Nothing)
    hits: Counter[str] = Counter()

    @wf.stage
    async def nap(ctx: StageContext[Nothing]) -> str:
        hits["body"] += 1
        await ctx.step.sleep("nap", timedelta(seconds=1))
        hits["after"] += 1
        return "woke"

    sink = MemorySink()
    engine = await make_engine(wf, event_sink=sink)
    async with engine.worker():
        run = await engine.start(wf, {})
        await eventually(
            lambda: _async(any(e.type == "stage.suspended" for e in sink.for_run(run.id)))
        )
    info = await engine.get_run(run.id)
    assert info.status == RunStatus.SUSPENDED
    await asyncio.sleep(2.0)  # the deadline passes with no worker up
    t0 = time.monotonic()
    async with engine.worker():
        info = await engine.wait(run.id, timeout=60)
        woke_in = time.monotonic() - t0
    assert info.status == RunStatus.COMPLETED and info.output == "woke"
    assert hits == {"body": 2, "after": 1}
    trace = _check_trace(sink.for_run(run.id), wf)
    assert trace == [
        ["run.created"],
        ["run.started"],
        ["stage.started", "nap", 1],
        ["stage.suspended", "nap", "sleep", "sleep:nap"],
        ["stage.completed", "nap", 1],
        ["run.completed"],
    ]
    assert woke_in < 15


async def _async(value: Any) -> Any:
    return value
