"""A run frozen for a move reads ``frozen`` in ``get_run`` and ``list_runs`` on each driver
(native on SQLite and PostgreSQL, Temporal), and no longer once the move is aborted or done:
before, an operator learnt of a run an interrupted migration left frozen only when one of its
signals was refused."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    Registry,
    RunInfo,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    abort_migration,
    create_engine,
    migrate_run,
)
from engine_port.errors import MigrationError


class In(BaseModel):
    n: int = 0


def _registry() -> tuple[Registry, str]:
    wf = Workflow(f"frz-{uuid.uuid4().hex[:8]}", input=In, version="v1")

    @wf.stage(signals=["go"])
    async def gate(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return Registry([wf]), wf.id


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("temporal", marks=pytest.mark.temporal),
    ]
)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """The driver under test and its database URL or Temporal address (the session-wide
    servers are started here, out of the test's event loop)."""
    if request.param == "temporal":
        return "temporal", request.getfixturevalue("temporal_server").address
    if request.param == "postgres":
        return "native", request.getfixturevalue("pg_session").new_schema()
    return "native", f"sqlite:///{tmp_path / 'wfe.db'}"


@pytest.fixture
async def pair(
    where: tuple[str, str], tmp_path: Path
) -> AsyncIterator[tuple[WorkflowEngine, WorkflowEngine, str]]:
    """(source, target, workflow id): the driver under test as the source; the target is
    the memory driver (a native source) or native on SQLite (the Temporal source)."""
    registry, wf_id = _registry()
    blobs = f"file://{tmp_path / 'blobs'}"
    driver, address = where
    if driver == "temporal":
        source = create_engine(
            EngineSettings(
                driver="temporal",
                temporal_address=address,
                task_queue=f"frz-{uuid.uuid4().hex[:8]}",
                blob_url=blobs,
            ),
            registry,
        )
        target = create_engine(
            EngineSettings(
                driver="native", database_url=f"sqlite:///{tmp_path / 't.db'}", blob_url=blobs
            ),
            registry,
        )
    else:
        source = create_engine(
            EngineSettings(driver="native", database_url=address, blob_url=blobs), registry
        )
        target = create_engine(EngineSettings(driver="memory", blob_url=blobs), registry)
    async with source, target, source.worker(), target.worker():
        yield source, target, wf_id


async def _until(
    read: Callable[[], Awaitable[RunInfo]], ok: Callable[[RunInfo], bool], what: str
) -> RunInfo:
    deadline = time.monotonic() + 60
    while not ok(info := await read()):
        assert time.monotonic() < deadline, f"{what}: still {info!r}"
        await asyncio.sleep(0.1)
    return info


async def _listed(engine: WorkflowEngine, wf_id: str, run_id: str, **kw: Any) -> RunInfo:
    [found] = [r for r in await engine.list_runs(workflow_id=wf_id, **kw) if r.id == run_id]
    return found


async def test_a_frozen_run_reads_frozen_until_its_move_is_aborted_or_done(
    pair: tuple[WorkflowEngine, WorkflowEngine, str],
) -> None:
    source, target, wf_id = pair
    run_id = (await source.start(wf_id, {"n": 1})).id
    got = await _until(
        lambda: source.get_run(run_id), lambda i: i.status == RunStatus.SUSPENDED, "suspended"
    )
    assert got.frozen is False
    assert (await _listed(source, wf_id, run_id)).frozen is False

    # frozen (a migration stopped between its freeze and its move): shown as such
    await source.export_run(run_id, wait=10)
    got = await source.get_run(run_id)
    assert (got.status, got.frozen) == (RunStatus.SUSPENDED, True)
    # (the Temporal listing reads the memo from the server's visibility store: polled)
    listed = await _until(
        lambda: _listed(source, wf_id, run_id), lambda i: i.frozen, "listed frozen"
    )
    assert listed.status == RunStatus.SUSPENDED
    assert (await _listed(source, wf_id, run_id, outputs=False)).frozen is True
    assert RunInfo.model_validate_json(got.model_dump_json()).frozen is True
    with pytest.raises(MigrationError, match="frozen"):
        await source.signal(run_id, "go", {})

    # the move given back: no longer frozen, and the run takes its signal again
    report = await abort_migration(source, target, [run_id])
    assert [m.outcome for m in report.moves] == ["unfrozen"]
    got = await source.get_run(run_id)
    assert (got.status, got.frozen) == (RunStatus.SUSPENDED, False)
    await _until(lambda: _listed(source, wf_id, run_id), lambda i: not i.frozen, "unfrozen")

    # the move done: migrated (not frozen) on the source, live and not frozen on the target
    await migrate_run(source, target, run_id, wait=10)
    got = await source.get_run(run_id)
    assert (got.status, got.frozen, got.migrated_to) == (
        RunStatus.MIGRATED,
        False,
        target.driver_name,
    )
    listed = await _until(
        lambda: _listed(source, wf_id, run_id, status=RunStatus.MIGRATED),
        lambda i: i.status == RunStatus.MIGRATED,
        "listed migrated",
    )
    assert listed.frozen is False
    moved = await target.get_run(run_id)
    assert (moved.status, moved.frozen) == (RunStatus.SUSPENDED, False)
    assert (await _listed(target, wf_id, run_id)).frozen is False
    await target.signal(run_id, "go", {"ok": True})
    done = await target.wait(run_id, timeout=60)
    assert (done.status, done.frozen) == (RunStatus.COMPLETED, False)


def test_run_info_without_the_field_still_loads() -> None:
    """A RunInfo written before the field (a cache, a client's stored JSON) reads not
    frozen."""
    old = '{"id": "r1", "workflow_id": "w", "version": "v1", "status": "suspended"}'
    info = RunInfo.model_validate_json(old)
    assert info.frozen is False
    assert "frozen" in info.model_dump()


@pytest.mark.parametrize(
    "where", [pytest.param("temporal", marks=pytest.mark.temporal)], indirect=True
)
async def test_a_frozen_run_ended_outside_the_engine_is_not_shown_frozen(
    pair: tuple[WorkflowEngine, WorkflowEngine, str],
) -> None:
    """An operator's ``temporal workflow terminate`` of a frozen run: its last memo still
    says frozen, but the run has ended (failed), and an ended run is never frozen."""
    source, _, wf_id = pair
    run_id = (await source.start(wf_id, {"n": 1})).id
    await _until(
        lambda: source.get_run(run_id), lambda i: i.status == RunStatus.SUSPENDED, "suspended"
    )
    await source.export_run(run_id, wait=10)
    assert (await source.get_run(run_id)).frozen is True
    await source._conn.get_workflow_handle(run_id).terminate(reason="an operator")  # type: ignore[attr-defined]
    got = await source.get_run(run_id)
    assert (got.status, got.frozen) == (RunStatus.FAILED, False)
    listed = await _until(
        lambda: _listed(source, wf_id, run_id), lambda i: i.terminal, "listed ended"
    )
    assert listed.frozen is False
