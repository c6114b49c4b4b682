"""A run's definition (the graph it executes, kept once per workflow and version) is written
by the first start of that version a process commits, not by every start: the snapshot of a
large graph was serialised, sent and ignored on conflict with every run."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from driver_native import process_available_jobs
from engine_port import StageContext, Workflow
from engine_port.errors import DefinitionVersionConflictError, IdempotencyConflictError

from . import workflows as w
from .conftest import MakeEngine, count_rows


async def test_a_definition_is_written_by_the_first_committed_start_only(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(w.linear)
    writes: list[str] = []

    def seen(_conn: Any, _cursor: Any, sql: str, *_a: Any) -> None:
        if "INSERT INTO wfe_definitions" in sql:
            writes.append(sql)

    event.listen(engine.kernel.db.engine, "before_cursor_execute", seen)
    first = await engine.start(w.linear, {"n": 1}, idempotency_key="k")
    assert len(writes) == 1
    # a start whose transaction does not commit a run does not count as having written it
    with pytest.raises(IdempotencyConflictError):
        await engine.start(w.linear, {"n": 2}, idempotency_key="k")
    await engine.start(w.linear, {"n": 3})
    await engine.start(w.linear, {"n": 4})
    assert len(writes) == 1
    assert await count_rows(engine, "wfe_definitions") == 1
    # another process on the same database writes it once too (ignored: it is there)
    other = await make_engine(w.linear)
    event.listen(other.kernel.db.engine, "before_cursor_execute", seen)
    second = await other.start(w.linear, {"n": 5})
    assert len(writes) == 2
    assert await count_rows(engine, "wfe_definitions") == 1
    async with engine.worker():
        for run in (first, second):
            assert (await engine.wait(run.id, timeout=30)).status == "completed"


def _pinned(*stage_ids: str) -> Workflow[w.Item]:
    """``it-pinned`` version "1" with these stages in a row (each returns its id)."""
    wf = Workflow("it-pinned", input=w.Item, version="1")
    before: list[Any] = []
    for sid in stage_ids:

        async def body(ctx: StageContext[w.Item], sid: str = sid) -> str:
            return sid

        before = [wf.stage(id=sid, after=before)(body)]
    return wf


async def test_a_structure_changed_under_its_version_is_refused_by_workers_and_starts(
    make_engine: MakeEngine,
) -> None:
    """A deploy that adds a stage but keeps ``version=``: its worker claimed the runs started
    with the old definition and failed in the engine on every claim (KeyError: the new
    stage has no row in them), re-running the stage before it each time, for good; a start
    made a run of that version with other stages than the definition the database keeps."""
    old = await make_engine(_pinned("a", "b"))
    run = await old.start("it-pinned", {"n": 1})
    changed = await make_engine(_pinned("a", "b", "c"))
    with pytest.raises(DefinitionVersionConflictError, match=r"stages \['c'\] are new"):
        async with changed.worker():
            pass
    with pytest.raises(DefinitionVersionConflictError, match="'it-pinned' version '1'"):
        await changed.start("it-pinned", {"n": 2})
    with pytest.raises(DefinitionVersionConflictError):  # (a serverless host: nothing claimed)
        await process_available_jobs(changed.kernel, 10)
    assert await count_rows(old, "wfe_runs") == 1
    rewired = await make_engine(_pinned("b", "a"))
    with pytest.raises(DefinitionVersionConflictError, match="run after other stages"):
        async with rewired.worker():
            pass
    # the same stages (other bodies, say) under that version are served
    same = await make_engine(_pinned("a", "b"))
    async with same.worker():
        assert (await same.wait(run.id, timeout=30)).output == "b"
