"""An operator's ``temporal workflow signal`` with a name the graph does not declare, checked
from outside through the Temporal API (the run's history and memo):

- it is rejected, logged and kept in the ``wfe_rejected_signals`` memo entry, as the README
  says, and the run goes on (no workflow task fails); it was queued silently instead, where
  no wait could ever take it (a wait for an undeclared name fails at once), so the operator
  had no sign that the signal went nowhere;
- the same when the signal reaches the run before its first workflow task (no worker yet);
- a workflow that declares no signals still takes any name.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from engine_port import MemorySink, Registry, StageContext, Workflow

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    pass


def _declaring(wf_id: str) -> Workflow[In]:
    wf = Workflow(wf_id, input=In)

    @wf.stage(signals=["approval"])
    async def approve(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("approval")

    return wf


async def _rejected(handle: Any, timeout: float = 20.0) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        memo = await (await handle.describe()).memo()
        if memo.get("wfe_rejected_signals"):
            return list(memo["wfe_rejected_signals"])
        await asyncio.sleep(0.1)
    return []


def _failed_tasks(history: Any) -> list[Any]:
    return [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]


async def test_an_operator_signal_of_an_undeclared_name_is_rejected_and_recorded(
    make_engine: EngineFactory,
) -> None:
    wf = _declaring("op-undeclared")
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("op-undeclared", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        handle = engine._conn.get_workflow_handle(run.id)
        # as `temporal workflow signal --name aproval --input '{"ok":true}'` sends it
        await handle.signal("aproval", {"ok": True})
        rejected = await _rejected(handle)
        await handle.signal("approval", {"ok": True})
        info = await engine.wait(run.id, timeout=30)
        history = await handle.fetch_history()
    assert [r["name"] for r in rejected] == ["aproval"], rejected
    assert "approval" in rejected[0]["reason"], rejected  # names what the graph declares
    assert info.status == "completed", info
    assert info.output == {"ok": True}
    assert not _failed_tasks(history)


async def test_an_undeclared_name_sent_before_the_first_task_is_rejected(
    make_engine: EngineFactory,
) -> None:
    wf = _declaring("op-undeclared-early")
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine:
        run = await engine.start("op-undeclared-early", {})
        handle = engine._conn.get_workflow_handle(run.id)
        await handle.signal("bogus", {"a": 1})  # no worker yet: buffered by the server
        await handle.signal("approval", {"ok": True})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
            rejected = await _rejected(handle)
            history = await handle.fetch_history()
    assert info.status == "completed", info
    assert info.output == {"ok": True}
    assert [r["name"] for r in rejected] == ["bogus"], rejected
    assert not _failed_tasks(history)


async def test_a_workflow_that_declares_no_signals_takes_any_name(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("op-any-name", input=In)

    @wf.stage()
    async def wait(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("whatever")

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("op-any-name", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        handle = engine._conn.get_workflow_handle(run.id)
        await handle.signal("whatever", [1, 2])
        info = await engine.wait(run.id, timeout=30)
        memo = await (await handle.describe()).memo()
        history = await handle.fetch_history()
    assert info.status == "completed", info
    assert info.output == [1, 2]
    assert "wfe_rejected_signals" not in memo
    assert not _failed_tasks(history)
