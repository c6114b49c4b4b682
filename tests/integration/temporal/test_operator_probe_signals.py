"""What an operator (or a second process) does to a run from outside, checked against what
the native driver does for the same action:

- a raw ``temporal workflow signal`` over the spill threshold is kept in the BlobStore behind
  a reference like one ``engine.signal`` sends: the stage activity that takes it carries the
  reference, never the payload (one near Temporal's 2 MiB limit used to fail every workflow
  task that lent it to the stage, forever);
- a run that winds down (compensating after a cancel) refuses signals as on the native
  driver: ``engine.signal`` raises RunNotActiveError, and an operator's raw signal is
  rejected and recorded, not queued;
- ``cancel()`` while no worker runs reads ``compensating`` (as on the native driver), and a
  signal sent then raises RunNotActiveError instead of reporting it delivered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from engine_port import MemorySink, Registry, StageContext, Workflow
from engine_port.errors import RunNotActiveError

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    pass


async def _until(check: Any, what: str, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_large_operator_signal_is_spilled_not_carried_by_activities(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    wf = Workflow("op-big-signal", input=In)

    @wf.stage(signals=["approval"])
    async def approve(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("approval")

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    big = {"blob": "x" * 300_000, "ok": True}
    async with engine, engine.worker():
        run = await engine.start("op-big-signal", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        handle = engine._conn.get_workflow_handle(run.id)
        await handle.signal("approval", big)  # as `temporal workflow signal` sends it
        info = await engine.wait(run.id, timeout=30)
        history = await handle.fetch_history()
    assert info.status == "completed", info
    assert info.output == big
    sizes = {
        e.event_id: len(e.activity_task_scheduled_event_attributes.input.SerializeToString())
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    assert sizes and max(sizes.values()) < 64 * 1024, sizes
    failed = [
        e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert not failed
    # the payload is in the run's own folder of the BlobStore
    assert list((blob_dir / "runs" / run.id / "signals").glob("raw-*.json"))


async def test_a_compensating_run_refuses_signals_from_an_engine_and_an_operator(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("op-winding", input=In)
    release = asyncio.Event()

    @wf.stage
    async def reserve(ctx: StageContext[In]) -> str:
        return "held"

    @reserve.compensation
    async def unreserve(ctx: StageContext[In], output: str) -> None:
        await asyncio.wait_for(release.wait(), 30)

    @wf.stage(after=[reserve], signals=["approval"])
    async def approve(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("approval")

    sink = MemorySink()
    registry = Registry([wf])
    engine = make_engine(registry, sink=sink, options={"cancel_wait": 0.2})
    # a second process's engine that saw the run waiting (it signals without reading first)
    other = make_engine(registry)
    async with engine, other, engine.worker():
        run = await engine.start("op-winding", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        assert (await other.get_run(run.id)).status == "suspended"
        await engine.cancel(run.id)

        async def compensating() -> bool:
            return (await engine.get_run(run.id)).status == "compensating"

        await _until(compensating, "the run to compensate")
        with pytest.raises(RunNotActiveError, match="compensating"):
            await other.signal(run.id, "approval", {"ok": True})
        with pytest.raises(RunNotActiveError, match="compensating"):
            await engine.signal(run.id, "approval", {"ok": True})
        handle = engine._conn.get_workflow_handle(run.id)
        await handle.signal("approval", {"from": "operator"})

        async def recorded() -> bool:
            memo = await (await handle.describe()).memo()
            return bool(memo.get("wfe_rejected_signals"))

        await _until(recorded, "the operator's signal to be rejected")
        release.set()
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "cancelled"
    assert {s.id: s.status for s in info.stages} == {
        "reserve": "compensated",
        "approve": "cancelled",
    }
    memo = await (await handle.describe()).memo()
    # the other engine's signal (refused by the run itself), then the operator's
    rejected = memo["wfe_rejected_signals"]
    assert [r["name"] for r in rejected] == ["approval", "approval"]
    assert rejected[0]["reason"] == "RunNotActiveError"
    assert "compensating" in rejected[1]["reason"]


async def test_cancel_while_no_worker_runs_reads_compensating_and_refuses_signals(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("op-cancel-idle", input=In)
    compensated: list[str] = []

    @wf.stage
    async def reserve(ctx: StageContext[In]) -> str:
        return "held"

    @reserve.compensation
    async def unreserve(ctx: StageContext[In], output: str) -> None:
        compensated.append(output)

    @wf.stage(after=[reserve], signals=["approval"])
    async def approve(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("approval")

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"cancel_wait": 0.2})
    async with engine:
        run = await engine.start("op-cancel-idle", {})
        async with engine.worker():
            await wait_for_event(sink, run.id, "stage.suspended")
        # no worker: the native driver marks the run compensating at once
        first = await engine.cancel(run.id)
        assert first.status == "compensating", first
        assert (await engine.get_run(run.id)).status == "compensating"
        again = await engine.cancel(run.id)
        assert again.status == "compensating"
        with pytest.raises(RunNotActiveError, match="compensating"):
            await engine.signal(run.id, "approval", {"ok": True})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
    assert info.status == "cancelled", info
    assert compensated == ["held"]
    assert {s.id: s.status for s in info.stages} == {
        "reserve": "compensated",
        "approve": "cancelled",
    }
