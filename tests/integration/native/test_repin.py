"""A redrive that re-pins a run that has not ended (S13), on the native driver: the routing of
each kind of job the run may hold moves with the run's version."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from engine_port import MemorySink, RunStatus, StageContext, Workflow

from .conftest import MakeEngine, eventually


class Nothing(BaseModel):
    pass


async def test_a_run_sleeping_on_a_timer_is_repinned_and_woken_by_the_new_version(
    make_engine: MakeEngine,
) -> None:
    """A stage asleep on a timer (its job parked until the wake time) re-pinned before the
    timer is due: the v2 worker wakes it when due and finishes it with v2's body; the step
    journaled under v1 is not run again and the sleep keeps its deadline (one suspension)."""
    ran: Counter[str] = Counter()

    def build(version: str) -> Workflow[Any]:
        wf = Workflow("it-repin-nap", input=Nothing, version=version)

        def x() -> str:
            ran[f"x@{version}"] += 1
            return f"x@{version}"

        @wf.stage
        async def a(ctx: StageContext[Any]) -> str:
            ran[f"a@{version}"] += 1
            got = await ctx.step.run("x", x)
            await ctx.step.sleep("nap", timedelta(seconds=2))
            return f"{got}/a@{version}"

        return wf

    sink = MemorySink()
    old = await make_engine(build("v1"), event_sink=sink)
    new = await make_engine(build("v2"), event_sink=sink)
    async with old.worker():
        run = await old.start("it-repin-nap", {})

        async def asleep() -> bool:
            info = await old.get_run(run.id)
            return info.status == RunStatus.SUSPENDED

        await eventually(asleep, timeout=60)
    moved = await new.redrive(run.id, version="latest")
    assert (moved.version, moved.status, moved.redrive_count) == ("v2", RunStatus.SUSPENDED, 1)
    async with new.worker():
        done = await new.wait(run.id, timeout=60)
    assert (done.status, done.output) == (RunStatus.COMPLETED, "x@v1/a@v2")
    assert ran == Counter({"a@v1": 1, "x@v1": 1, "a@v2": 1})

    async def delivered() -> list[str]:
        types = [e.type for e in sink.for_run(run.id)]
        return types if "run.completed" in types else []

    types = await eventually(delivered, timeout=60)
    assert types.count("stage.started") == types.count("stage.suspended") == 1
    assert types.index("stage.suspended") < types.index("run.redriven")
