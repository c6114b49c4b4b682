"""What the Web UI offers an operator on a run: "Send a Signal" lists the graph's declared
signal names, and every query and update of the engine is named ``wfe.internal.*`` and
described as internal. The UI reads them from the ``__temporal_workflow_metadata`` query,
asked here through the client as the UI does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.sdk.v1 import WorkflowMetadata

from engine_port import Registry, StageContext, Workflow

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal

# built in by temporalio: not the engine's
_SDK_QUERIES = {"__stack_trace", "__enhanced_stack_trace", "__temporal_workflow_metadata"}


class Order(BaseModel):
    item: str


async def _until_waiting(engine: Any, run_id: str, name: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        info = await engine.get_run(run_id)
        if any(s.waiting_for == f"signal:{name}" for s in info.stages):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never waited for {name}")


async def test_the_ui_lists_declared_signals_and_marks_internal_handlers(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("declared", input=Order)

    @wf.stage(signals=["approval"])
    async def approve(ctx: StageContext[Order]) -> Any:
        return await ctx.step.wait_for_signal("approval")

    @wf.stage(after=[approve], signals=["shipped"])
    async def ship(ctx: StageContext[Order]) -> Any:
        return {
            "approval": ctx.output_of("approve"),
            "shipped": await ctx.step.wait_for_signal("shipped"),
        }

    engine = make_engine(Registry([wf]))
    async with engine:
        run = await engine.start("declared", {"item": "book"})
        handle = engine._conn.get_workflow_handle(run.id)
        async with engine.worker():
            await _until_waiting(engine, run.id, "approval")
            meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
            # the declared names take an operator's signal as the dynamic handler did: two
            # inputs are rejected and recorded (the run goes on), one is queued as given
            await handle.signal("approval", args=[1, 2])
            await handle.signal("approval", {"ok": True})
            await _until_waiting(engine, run.id, "shipped")
            res = await engine.signal(run.id, "shipped", "today")
            info = await engine.wait(run.id, timeout=30)
        memo = await (await handle.describe()).memo()
    definition = meta.definition
    signals = sorted(s.name for s in definition.signal_definitions if s.name)
    assert signals == ["approval", "shipped"]
    updates = {u.name: u.description for u in definition.update_definitions}
    queries = {
        q.name: q.description for q in definition.query_definitions if q.name not in _SDK_QUERIES
    }
    assert updates and queries
    for name, description in {**updates, **queries}.items():
        assert name.startswith("wfe.internal."), name
        assert description.startswith("internal: do not send by hand"), (name, description)
    # a run started now declares none of the older names (runs started before still do)
    assert "wfe.freeze" not in updates and "wfe.signal" not in updates
    assert res.delivered
    assert info.status == "completed", info
    assert info.output == {"approval": {"ok": True}, "shipped": "today"}
    assert [r["name"] for r in memo["wfe_rejected_signals"]] == ["approval"]
    assert "carried 2" in memo["wfe_rejected_signals"][0]["reason"]
