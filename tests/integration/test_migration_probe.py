"""Moving live runs as an operator does: two native databases that keep their spilled values
in different blob stores, and a move whose import fails after it committed."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
    migrate_run,
    open_blob_store,
)
from engine_port.errors import MigrationError, SpilledPayloadUnavailableError


class Big(BaseModel):
    text: str


def _waiter() -> Workflow[Big]:
    wf = Workflow(f"probe-mig-{uuid.uuid4().hex[:8]}", input=Big, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Big]) -> Any:
        got = await ctx.step.wait_for_signal("go")
        return {"got": got, "len": len(ctx.input.text)}

    return wf


def _engine(tmp_path: Path, name: str, registry: Registry) -> WorkflowEngine:
    return create_engine(
        EngineSettings(
            database_url=f"sqlite:///{tmp_path / f'{name}.db'}",
            blob_url=f"file://{tmp_path / f'{name}-blobs'}",
            spill_threshold_bytes=100,
        ),
        registry,
    )


async def _suspended(engine: WorkflowEngine, wf: Workflow[Big]) -> str:
    run = await engine.start(wf.id, {"text": "x" * 1000})  # spilled: over the threshold
    async with engine.worker():
        for _ in range(300):
            if (await engine.get_run(run.id)).status == RunStatus.SUSPENDED:
                return run.id
            await asyncio.sleep(0.05)
    raise AssertionError("the run never suspended")


@contextlib.asynccontextmanager
async def _parked_run(tmp_path: Path) -> AsyncIterator[tuple[WorkflowEngine, WorkflowEngine, str]]:
    """Two SQLite engines, each with its own blob folder, and a run parked in its signal wait
    on the first (its input spilled)."""
    wf = _waiter()
    registry = Registry([wf])
    async with (
        _engine(tmp_path, "src", registry) as src,
        _engine(tmp_path, "dst", registry) as dst,
    ):
        yield src, dst, await _suspended(src, wf)


async def _finishes_on(target: WorkflowEngine, run_id: str) -> None:
    """The moved run, signalled on ``target``, completes there with its input read back."""
    async with target.worker():
        await target.signal(run_id, "go", {"ok": True})
        info = await target.wait(run_id, timeout=30)
    assert info.status == RunStatus.COMPLETED
    assert info.output == {"got": {"ok": True}, "len": 1000}


async def test_a_run_with_spilled_values_moves_between_blob_stores(tmp_path: Path) -> None:
    """The target read the run's spilled input from its own store, which did not have it:
    the import had committed, the error unfroze the run at the source, and the run was
    active on both databases. The engines' stores are now copied across by default."""
    async with _parked_run(tmp_path) as (src, dst, run_id):
        move = await migrate_run(src, dst, run_id)
        assert move.outcome == "moved", move
        assert (await src.get_run(run_id)).status == RunStatus.MIGRATED
        await _finishes_on(dst, run_id)


async def test_an_import_that_fails_after_committing_leaves_the_run_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target imported the run, then failed (here: reading it back). The source unfroze
    the run, so it was live on both. Now it stays frozen there (a signal is refused with the
    retry-me error) and a rerun finishes the move once."""
    async with _parked_run(tmp_path) as (src, dst, run_id):
        read = dst.get_run
        failures = [OSError("disk gone")]

        async def get_run(rid: str) -> Any:
            if failures:
                raise failures.pop()
            return await read(rid)

        monkeypatch.setattr(dst, "get_run", get_run)
        with pytest.raises(MigrationError, match="run the migration again"):
            await migrate_run(src, dst, run_id)
        with pytest.raises(MigrationError, match="being moved"):
            await src.signal(run_id, "go", {"early": True})
        move = await migrate_run(src, dst, run_id)
        assert move.outcome == "moved", move
        assert (await src.get_run(run_id)).status == RunStatus.MIGRATED
        assert [r.id for r in await dst.list_runs(outputs=False)] == [run_id]
        await _finishes_on(dst, run_id)


async def test_blobs_copied_into_the_wrong_store_fail_the_import_before_it_writes(
    tmp_path: Path,
) -> None:
    """Blobs copied into a store the target does not read: the import wrote the run and
    only then failed to read its input (the case above). Now it refuses before writing
    anything: the run goes on at the source, the target holds nothing, and the move with
    the right stores succeeds."""
    async with _parked_run(tmp_path) as (src, dst, run_id):
        wrong = open_blob_store(f"file://{tmp_path / 'elsewhere'}")
        right = open_blob_store(f"file://{tmp_path / 'src-blobs'}")
        with pytest.raises(SpilledPayloadUnavailableError):
            await migrate_run(src, dst, run_id, blobs=(right, wrong))
        assert await dst.list_runs(outputs=False) == []
        assert (await src.get_run(run_id)).status == RunStatus.SUSPENDED
        move = await migrate_run(src, dst, run_id)
        assert move.outcome == "moved", move
        await _finishes_on(dst, run_id)


async def test_a_run_parked_in_a_signal_wait_reads_suspended_after_the_move(
    tmp_path: Path,
) -> None:
    """The imported run read ``running`` (and ``list_runs(status="suspended")`` missed it)
    until its signal came, although it was suspended at the source and nothing ran."""
    async with _parked_run(tmp_path) as (src, dst, run_id):
        assert (await migrate_run(src, dst, run_id)).outcome == "moved"
        assert (await dst.get_run(run_id)).status == RunStatus.SUSPENDED
        parked = await dst.list_runs(status=RunStatus.SUSPENDED, outputs=False)
        assert [r.id for r in parked] == [run_id]


@pytest.mark.temporal
async def test_a_run_with_spilled_values_moves_off_temporal_into_another_store(
    temporal_server: Any, tmp_path: Path
) -> None:
    """Temporal -> native with their own blob stores (the CLI's case on PostgreSQL, whose
    default ``db://`` store is not the folder Temporal spills into): the spilled input was
    not copied and the move failed after the import, leaving the run live on both."""
    wf = _waiter()
    registry = Registry([wf])
    temporal = create_engine(
        EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"pm-{uuid.uuid4().hex[:10]}",
            blob_url=f"file://{tmp_path / 'temporal-blobs'}",
            spill_threshold_bytes=100,
        ),
        registry,
    )
    async with temporal as src, _engine(tmp_path, "dst", registry) as dst:
        run_id = await _suspended(src, wf)
        move = await migrate_run(src, dst, run_id)
        assert move.outcome == "moved", move
        assert (await src.get_run(run_id)).status == RunStatus.MIGRATED
        await _finishes_on(dst, run_id)
