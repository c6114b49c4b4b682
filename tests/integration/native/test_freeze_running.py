"""Exporting a run for migration while one of its stages runs (``wfe migrate --wait``): the
export waits for that stage, and the stage after it waits frozen instead of being handed on to
the same worker at once, which made the freeze lose the race at every stage (the run ran to
its end, or the export gave up after its wait). An export that gives up leaves the run as it
was: not frozen, signals taken, and it goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, StageContext, Workflow
from engine_port.errors import MigrationError

from .conftest import MakeEngine


class In(BaseModel):
    pass


def _chain(gates: dict[str, asyncio.Event], entered: dict[str, asyncio.Event]) -> Workflow[In]:
    wf = Workflow("freeze-running", input=In)

    def body(name: str) -> Any:
        async def run(ctx: StageContext[In]) -> str:
            entered[name].set()
            await asyncio.wait_for(gates[name].wait(), 60)
            return name

        run.__name__ = name
        return run

    a = wf.stage(id="a")(body("a"))
    b = wf.stage(id="b", after=[a])(body("b"))

    @wf.stage(after=[b], signals=["go"])
    async def c(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


async def test_an_export_waits_for_the_running_stage_and_the_next_one_waits_frozen(
    make_engine: MakeEngine,
) -> None:
    gates = {n: asyncio.Event() for n in "ab"}
    entered = {n: asyncio.Event() for n in "ab"}
    gates["b"].set()  # b would finish at once if it were handed on
    engine = await make_engine(_chain(gates, entered), event_sink=MemorySink())
    async with engine.worker():
        run = await engine.start("freeze-running", {})
        await asyncio.wait_for(entered["a"].wait(), 30)
        export = asyncio.ensure_future(engine.export_run(run.id, wait=30))
        await asyncio.sleep(0.2)  # (the export is waiting for a)
        assert not export.done()
        gates["a"].set()
        snapshot = await asyncio.wait_for(export, 30)
        assert {s.id: s.status for s in snapshot.stages} == {
            "a": "completed",
            "b": "pending",
            "c": "pending",
        }
        assert not entered["b"].is_set()  # b did not start here
        # the move is given up: the run goes on here, whole
        await engine.abort_export(run.id)
        await asyncio.wait_for(entered["b"].wait(), 30)
        for _ in range(600):
            if (await engine.get_run(run.id)).status == "suspended":
                break
            await asyncio.sleep(0.05)
        await engine.signal(run.id, "go", 7)
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed" and info.output == 7


async def test_an_export_that_gives_up_leaves_the_run_unfrozen(make_engine: MakeEngine) -> None:
    gates = {n: asyncio.Event() for n in "ab"}
    entered = {n: asyncio.Event() for n in "ab"}
    gates["b"].set()
    engine = await make_engine(_chain(gates, entered), event_sink=MemorySink())
    async with engine.worker():
        run = await engine.start("freeze-running", {})
        await asyncio.wait_for(entered["a"].wait(), 30)
        with pytest.raises(MigrationError, match="not at a safe point"):
            await engine.export_run(run.id, wait=0.3)
        gates["a"].set()
        await asyncio.wait_for(entered["b"].wait(), 30)  # handed on as before
        for _ in range(600):
            if (await engine.get_run(run.id)).status == "suspended":
                break
            await asyncio.sleep(0.05)
        await engine.signal(run.id, "go", 8)  # (a frozen run refuses signals)
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed" and info.output == 8
