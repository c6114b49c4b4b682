"""The memo and search-attribute writes of a run, counted in its history through the Temporal
API (issue 13: each is a command the dev server persists and indexes). Every write must carry a
change (the ``wfe_run`` memo compared without its ``updated_at``, the search attributes as a
whole), and a short run writes each at most once per workflow task: these pin the counts, so a
write added to the workflow task's path fails here. Since 2026-12-02 ``WfeStage`` names the
stages a run waits (or failed) in, not those that merely run, so a run whose stages just run
writes its search attributes only when its status changes; the visibility queries on
``WfeStage`` / ``WfeStatus`` still find a run waiting for a signal, and a failed run by the
stage it failed in."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.converter import DataConverter

from driver_temporal import create_temporal_engine
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    Registry,
    Retry,
    StageContext,
    Workflow,
)

pytestmark = pytest.mark.temporal

_MEMO = EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED
_SA = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
_TASK = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


class In(BaseModel):
    n: int = 0


def _registry() -> Registry:
    workflows: list[Workflow[In]] = []
    for local in (False, True):
        wf = Workflow("seq3-local" if local else "seq3", input=In)

        @wf.stage(local=local)
        async def a(ctx: StageContext[In]) -> int:
            return 1

        @wf.stage(after=[a], local=local)
        async def b(ctx: StageContext[In]) -> int:
            return 2

        @wf.stage(after=[b], local=local)
        async def c(ctx: StageContext[In]) -> int:
            return 3

        workflows.append(wf)
    sig = Workflow("waits", input=In)

    @sig.stage
    async def first(ctx: StageContext[In]) -> int:
        return 1

    @sig.stage(after=[first])
    async def wait(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    workflows.append(sig)
    bad = Workflow("fails", input=In)

    @bad.stage
    async def fine(ctx: StageContext[In]) -> int:
        return 1

    @bad.stage(after=[fine], retry=Retry(max_attempts=1))
    async def boom(ctx: StageContext[In]) -> int:
        raise ValueError("boom")

    workflows.append(bad)
    return Registry(workflows)


def _writes(history: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The run's ``wfe_run`` memo writes (without ``updated_at``), its search-attribute
    writes and its completed workflow tasks."""
    conv = DataConverter.default.payload_converter
    memos: list[dict[str, Any]] = []
    sas: list[dict[str, Any]] = []
    for ev in history.events:
        if ev.event_type == _MEMO:
            fields = ev.workflow_properties_modified_event_attributes.upserted_memo.fields
            run = dict(conv.from_payload(fields["wfe_run"]))
            run.pop("updated_at", None)
            memos.append(run)
        elif ev.event_type == _SA:
            attrs = ev.upsert_workflow_search_attributes_event_attributes.search_attributes
            sas.append({k: conv.from_payload(v) for k, v in attrs.indexed_fields.items()})
    tasks = sum(1 for ev in history.events if ev.event_type == _TASK)
    return memos, sas, tasks


def _each_a_change(writes: list[dict[str, Any]]) -> None:
    for before, after in itertools.pairwise(writes):
        assert before != after, f"a write of unchanged content: {after}"


async def _history(engine: Any, run_id: str, *, ended: bool = False) -> Any:
    """The run's history once it completed (``ended``: once it ended, failed included)."""
    handle = engine._conn.get_workflow_handle(run_id)
    if ended:
        with contextlib.suppress(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)
    else:
        await asyncio.wait_for(handle.result(), 60)
    return await handle.fetch_history()


@pytest.fixture
def engine(temporal_address: str, blob_dir: Path) -> Any:
    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_address,
        task_queue=f"t-{uuid.uuid4().hex[:10]}",
        blob_url=f"file://{blob_dir}",
    )
    return create_temporal_engine(settings, _registry(), blob_store=FolderBlobStore(blob_dir))


@pytest.mark.parametrize(("wf", "tasks"), [("seq3", 4), ("seq3-local", 1)])
async def test_a_three_stage_run_writes_once_per_change(engine: Any, wf: str, tasks: int) -> None:
    async with engine, engine.worker():
        run = await engine.start(wf, {})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed", info.error
        memos, sas, done = _writes(await _history(engine, run.id))
    assert done == tasks
    _each_a_change(memos)
    _each_a_change(sas)
    assert memos[-1]["status"] == "completed"
    assert [st["status"] for st in memos[-1]["stages"]] == ["completed"] * 3
    if wf == "seq3":
        # the memo and the search attributes only when the run's status changes: WfeStage
        # names the stages a run waits in, and these just run (it wrote WfeStage a, b, c, ""
        # before 2026-12-02), and get_run asks the run for the stages in between (it wrote a
        # memo per stage started, 4, before the afternoon of 2026-12-02)
        assert [m["status"] for m in memos] == ["running", "completed"], memos
        assert sas == [
            {"WfeStatus": "running", "WfeStage": ""},
            {"WfeStatus": "completed", "WfeStage": ""},
        ]
    else:
        # local activities all complete in the run's one workflow task: a write between
        # them would show nobody anything, so the run writes once, at the end (it wrote 4
        # of each, 3 history events per stage more, before 2026-12-02)
        assert len(memos) == 1, memos
        assert sas == [{"WfeStatus": "completed", "WfeStage": ""}]


async def test_a_signalled_run_writes_once_per_change(engine: Any) -> None:
    async with engine, engine.worker():
        run = await engine.start("waits", {})
        for _ in range(600):
            if (await engine.get_run(run.id)).status == "suspended":
                break
            await asyncio.sleep(0.05)
        await engine.signal(run.id, "go", {"ok": True})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed", info.error
        memos, sas, _ = _writes(await _history(engine, run.id))
    # first runs (and wait after it: no write), then waits; the signal's own task writes
    # nothing (it wrote running, running, suspended, completed before 2026-12-02 afternoon)
    assert [m["status"] for m in memos] == ["running", "suspended", "completed"]
    # the search attributes only as the status changes; WfeStage names the stage waiting
    assert sas == [
        {"WfeStatus": "running", "WfeStage": ""},
        {"WfeStatus": "suspended", "WfeStage": "wait"},
        {"WfeStatus": "completed", "WfeStage": ""},
    ]
    _each_a_change(memos)
    _each_a_change(sas)


async def _listed(engine: Any, query: str, want: list[str]) -> list[str]:
    """The runs the visibility query lists, once they are ``want`` (visibility is eventually
    consistent) or after 10 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        ids = [ex.id async for ex in engine._conn.list_workflows(query)]
        if ids == want or loop.time() > deadline:
            return ids
        await asyncio.sleep(0.1)


async def test_a_run_waiting_for_a_signal_is_found_by_its_stage_and_status(engine: Any) -> None:
    async with engine:
        async with engine.worker():
            run = await engine.start("waits", {})
            for _ in range(600):
                if (await engine.get_run(run.id)).status == "suspended":
                    break
                await asyncio.sleep(0.05)
        # with no worker up: the operator's query (Web UI, `temporal workflow list`) and the
        # engine's listing both find it where it waits
        this = f"WorkflowId = '{run.id}'"
        waiting = await _listed(
            engine, f"{this} AND WfeStage = 'wait' AND WfeStatus = 'suspended'", [run.id]
        )
        elsewhere = await _listed(engine, f"{this} AND WfeStage = 'first'", [])
        suspended = await engine.list_runs(workflow_id="waits", status="suspended")
        info = await engine.get_run(run.id)
        async with engine.worker():
            await engine.signal(run.id, "go", {"ok": True})
            done = await engine.wait(run.id, timeout=60)
        after = await _listed(engine, f"{this} AND WfeStage = 'wait'", [])
    assert waiting == [run.id]
    assert elsewhere == []
    assert [r.id for r in suspended] == [run.id]
    assert [(s.id, s.status, s.waiting_for) for s in info.stages] == [
        ("first", "completed", None),
        ("wait", "suspended", "signal:go"),
    ]
    assert done.status == "completed", done.error
    # it waits no more (the close wrote WfeStage "" in the same task as the result)
    assert after == []


async def test_a_failed_run_is_found_by_the_stage_it_failed_in(engine: Any) -> None:
    async with engine, engine.worker():
        run = await engine.start("fails", {})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "failed"
        _, sas, _ = _writes(await _history(engine, run.id, ended=True))
        found = await _listed(
            engine,
            f"WorkflowId = '{run.id}' AND WfeStage = 'boom' AND WfeStatus = 'failed'",
            [run.id],
        )
        failed = await engine.list_runs(workflow_id="fails", status="failed")
    assert sas == [
        {"WfeStatus": "running", "WfeStage": ""},
        {"WfeStatus": "failed", "WfeStage": "boom"},
    ]
    assert found == [run.id]
    assert [r.id for r in failed] == [run.id]
