"""Export at the edges of a stage attempt: a stage activity that is scheduled but was never
picked up by a worker is still a safe point (the freeze withdraws it at once; the snapshot shows
its attempt started and nobody running it, and the target continues that attempt without a
second ``stage.started``); a stage a worker did pick up is waited for, and runs once."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import PendingActivityState

from conformance import ExecutionLog
from conformance._models import Num
from driver_temporal import TemporalEngine
from driver_temporal._activities import DriverActivities
from driver_temporal._start import StartDocument
from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
    migrate_run,
)
from engine_port.errors import MigrationError

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal


def _workflow(log: ExecutionLog, name: str, *, slow_a: float = 0.0) -> Workflow[Num]:
    wf = Workflow(f"{name}-{time.monotonic_ns()}", input=Num, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Num]) -> str:
        log.hit("a:enter")
        if slow_a:
            await asyncio.sleep(slow_a)
        log.hit("a")
        return "a"

    @wf.stage(after=[a])
    async def b(ctx: StageContext[Num]) -> str:
        log.hit("b")
        return "b"

    return wf


async def _pending_activities(engine: TemporalEngine, run_id: str) -> list[Any]:
    desc = await engine._conn.get_workflow_handle(run_id).describe()
    return list(desc.raw_description.pending_activities)


async def _scheduled_by_helper(engine: TemporalEngine, wf: Workflow[Num], run_id: str) -> None:
    """Let the engine's workflow-only helper run the run's first workflow task (no stage
    worker exists anywhere), until the first stage's activity is scheduled."""
    await engine._helper(wf.id, wf.version)
    deadline = time.monotonic() + 20
    while not await _pending_activities(engine, run_id):
        assert time.monotonic() < deadline, "the first stage activity was never scheduled"
        await asyncio.sleep(0.05)
    (act,) = await _pending_activities(engine, run_id)
    assert act.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED


def _native(tmp_path: Path, registry: Registry, sink: MemorySink, blob_dir: Path) -> WorkflowEngine:
    return create_engine(
        EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
            blob_url=f"file://{blob_dir}",
            lease_seconds=1.0,
        ),
        registry,
        event_sink=sink,
    )


async def test_export_takes_a_stage_scheduled_but_never_picked_up(
    make_engine: EngineFactory, tmp_path: Path, blob_dir: Path
) -> None:
    log = ExecutionLog(tmp_path / "log")
    wf = _workflow(log, "mig-sched")
    registry = Registry([wf])
    sink = MemorySink()
    source = make_engine(registry, sink=sink)
    await source.connect()
    run = await source.start(wf.id, {"n": 1})
    await _scheduled_by_helper(source, wf, run.id)
    assert (await source.get_run(run.id)).stage("a").status == "running"  # scheduled

    async with _native(tmp_path, registry, sink, blob_dir) as target:
        t0 = time.monotonic()
        move = await migrate_run(source, target, run.id, wait=20)
        assert move.outcome == "moved", move
        assert time.monotonic() - t0 < 10, "the freeze waited for a stage that never started"
        assert (await source.get_run(run.id)).status == RunStatus.MIGRATED
        # the scheduled activity was withdrawn with the run: a stage worker arriving on the
        # source now finds nothing to run
        async with source.worker():
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
            await source.flush_events()
    assert info.status == RunStatus.COMPLETED and info.output == "b"
    assert log.counts() == {"a:enter": 1, "a": 1, "b": 1}
    # the source announced a's attempt before the freeze withdrew it; the target continued it
    assert trace(sink, run.id) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("run.migrated", None),
        ("stage.completed", "a"),
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("run.completed", None),
    ]
    assert len(sink.events) == len(sink.for_run(run.id))  # nothing delivered twice


@pytest.mark.parametrize("journal_fails", [0, 4], ids=["store-up", "store-fails-4-times"])
async def test_export_after_abort_runs_the_withdrawn_stage_once_on_the_source(
    make_engine: EngineFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    journal_fails: int,
) -> None:
    """... also when the BlobStore fails the first reads of the withdrawn stage's journal (a
    storage fault: retried, never the run's failure; three failures failed the whole run)."""
    real = DriverActivities.read_journal
    reads: list[int] = []

    @functools.wraps(real)
    async def flaky(self: DriverActivities, *args: Any) -> list[dict[str, Any]]:
        reads.append(1)
        if len(reads) <= journal_fails:
            raise OSError("the blob store is down")
        return await real(self, *args)

    monkeypatch.setattr(DriverActivities, "read_journal", flaky)
    log = ExecutionLog(tmp_path / "log")
    wf = _workflow(log, "mig-abort")
    sink = MemorySink()
    source = make_engine(Registry([wf]), sink=sink)
    await source.connect()
    run = await source.start(wf.id, {"n": 1})
    await _scheduled_by_helper(source, wf, run.id)
    t0 = time.monotonic()
    snapshot = await source.export_run(run.id, wait=20)
    assert time.monotonic() - t0 < 10
    assert snapshot.status == RunStatus.RUNNING
    assert [(s.id, s.status, s.attempt) for s in snapshot.stages] == [
        ("a", "running", 1),  # started, and nobody runs it
        ("b", "pending", 0),
    ]
    assert len(reads) == journal_fails + 1
    await source.abort_export(run.id)
    async with source.worker():
        info = await source.wait(run.id, timeout=60)
        await source.flush_events()
    assert info.status == RunStatus.COMPLETED
    assert log.counts() == {"a:enter": 1, "a": 1, "b": 1}
    # a's withdrawn attempt was scheduled again: one stage.started
    assert trace(sink, run.id) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("stage.completed", "a"),
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("run.completed", None),
    ]


async def test_export_still_waits_for_a_stage_a_worker_picked_up(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    log = ExecutionLog(tmp_path / "log")
    wf = _workflow(log, "mig-running", slow_a=3.0)
    sink = MemorySink()
    source = make_engine(Registry([wf]), sink=sink)
    await source.connect()
    run = await source.start(wf.id, {"n": 1})
    async with source.worker():
        deadline = time.monotonic() + 20
        while log.count("a:enter") == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        with pytest.raises(MigrationError, match="has a stage running"):
            await source.export_run(run.id, wait=0.5)
        t0 = time.monotonic()
        snapshot = await source.export_run(run.id, wait=30)
        assert time.monotonic() - t0 > 1.0  # it waited for a to finish
        assert log.count("a") == 1
        assert [(s.id, s.status) for s in snapshot.stages] == [
            ("a", "completed"),
            ("b", "pending"),
        ]
        await source.abort_export(run.id)
        info = await source.wait(run.id, timeout=60)
        await source.flush_events()
    assert info.status == RunStatus.COMPLETED
    assert log.counts() == {"a:enter": 1, "a": 1, "b": 1}
    assert [t for t, _ in trace(sink, run.id)].count("stage.started") == 2


async def test_a_local_first_stage_scheduled_by_the_helper_runs_once(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """The workflow-only helper (hosted while migrating) can be handed a new run's first
    workflow task; a ``local=True`` first stage runs in that task, so the helper runs it once,
    and the rest of the run waits for a stage worker."""
    log = ExecutionLog(tmp_path / "log")
    wf = Workflow(f"mig-local-{time.monotonic_ns()}", input=Num, version="v1")

    @wf.stage(local=True)
    async def a(ctx: StageContext[Num]) -> str:
        log.hit("a")
        return "a"

    @wf.stage(after=[a])
    async def b(ctx: StageContext[Num]) -> str:
        log.hit("b")
        return ctx.output_of(a) + "b"

    source = make_engine(Registry([wf]))
    await source.connect()
    await source._helper(wf.id, wf.version)
    run = await source.start(wf.id, {"n": 1})
    deadline = time.monotonic() + 30
    while (await source.get_run(run.id)).stage("a").status != "completed":
        assert time.monotonic() < deadline, await source.get_run(run.id)
        await asyncio.sleep(0.1)
    assert log.counts() == {"a": 1}
    async with source.worker():
        info = await source.wait(run.id, timeout=60)
    assert info.status == RunStatus.COMPLETED and info.output == "ab"
    assert log.counts() == {"a": 1, "b": 1}


async def test_a_cancel_of_a_frozen_run_is_refused_as_on_native(make_engine: EngineFactory) -> None:
    """A cancel of a run frozen for a move ended the run cancelled here while the move went
    on: the target's import had the run live and uncancelled there, the source's
    complete_export then failed ("is cancelled"), and the caller's cancel was lost. The
    native driver refuses it with the retry-me MigrationError; so does Temporal now."""
    wf = Workflow(f"mig-cancel-{time.monotonic_ns()}", input=Num, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Num]) -> Any:
        return await ctx.step.wait_for_signal("go")

    engine = make_engine(Registry([wf]))
    async with engine.worker():
        run = await engine.start(wf.id, {"n": 1})
        deadline = time.monotonic() + 60
        while (await engine.get_run(run.id)).status != RunStatus.SUSPENDED:
            assert time.monotonic() < deadline, "the run never suspended"
            await asyncio.sleep(0.05)
        await engine.export_run(run.id)
        with pytest.raises(MigrationError, match="being moved to another driver") as refused:
            await engine.cancel(run.id)
        assert "--abort" in str(refused.value)
        assert (await engine.get_run(run.id)).status == RunStatus.SUSPENDED
        await engine.abort_export(run.id)  # the move given up: the cancel goes through
        await engine.cancel(run.id)
        info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.CANCELLED


def _waits_for_go(name: str) -> Workflow[Num]:
    wf = Workflow(f"{name}-{time.monotonic_ns()}", input=Num, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Num]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


async def _suspended(engine: WorkflowEngine, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while (await engine.get_run(run_id)).status != RunStatus.SUSPENDED:
        assert time.monotonic() < deadline, "the run never suspended"
        await asyncio.sleep(0.05)


async def test_a_raw_cancel_of_a_frozen_run_does_not_break_its_move(
    make_engine: EngineFactory, tmp_path: Path, blob_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The memo check of ``cancel()`` races a freeze (read unfrozen, frozen, then the cancel
    request), and an operator's ``temporal workflow cancel`` does not check at all. Such a
    cancel ended the frozen run cancelled here: ``complete_export`` then failed ("is
    cancelled") with the run live on the target, cancelled here and the cancel lost. The
    workflow now keeps a frozen run going (the cancel is deferred), and the move completes.
    The operator, whom nothing else answers, is told in the worker's log as the cancel is
    deferred and, as the move completes, that it is dropped and where to cancel the run now
    (they were told only that a completed move would drop it)."""
    caplog.set_level(logging.WARNING, logger="temporalio.workflow")
    wf = _waits_for_go("mig-raw-cancel")
    registry = Registry([wf])
    sink = MemorySink()
    source = make_engine(registry, sink=sink)
    async with source.worker():
        run = await source.start(wf.id, {"n": 1})
        await _suspended(source, run.id)
        snapshot = await source.export_run(run.id)
        async with _native(tmp_path, registry, sink, blob_dir) as target:
            await target.import_run(snapshot)
            await source._conn.get_workflow_handle(run.id).cancel()  # what the race amounts to
            await source.complete_export(run.id, "native")
            info = await source.wait(run.id, timeout=60)
            assert info.status == RunStatus.MIGRATED and info.migrated_to == "native"
            told = [r.getMessage() for r in caplog.records if run.id in r.getMessage()]
            assert any("a cancel of it is deferred" in m for m in told), told
            dropped = f"run {run.id} moved to native: the cancel it deferred while frozen is "
            assert any(m.startswith(dropped + "dropped here; cancel it on native") for m in told), (
                told
            )
            async with target.worker():
                await _suspended(target, run.id)
                await target.signal(run.id, "go", "went")
                moved = await target.wait(run.id, timeout=60)
    assert moved.status == RunStatus.COMPLETED and moved.output == "went"


async def test_a_cancel_racing_a_freeze_is_refused_and_applied_if_the_move_is_aborted(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cancel()`` read the memo before the freeze landed (a stale memo, made here), so its
    check passed and its cancel request reached a frozen run: it now reports the run's
    refusal as the same MigrationError; the run stays frozen and suspended, and once the move
    is aborted (the run stays here) the cancel it deferred takes effect."""
    wf = _waits_for_go("mig-cancel-race")
    engine = make_engine(Registry([wf]))
    async with engine.worker():
        run = await engine.start(wf.id, {"n": 1})
        await _suspended(engine, run.id)
        stale = await engine._describe(run.id)  # read before the freeze
        await engine.export_run(run.id)
        real = engine._describe
        calls = 0

        async def describe_stale_once(run_id: str) -> Any:
            nonlocal calls
            calls += 1
            return stale if calls == 1 else await real(run_id)

        monkeypatch.setattr(engine, "_describe", describe_stale_once)
        t0 = time.monotonic()
        with pytest.raises(MigrationError, match="being moved to another driver"):
            await engine.cancel(run.id)
        assert time.monotonic() - t0 < engine.cancel_wait, "the refusal waited for the run to end"
        monkeypatch.setattr(engine, "_describe", real)
        assert (await engine.get_run(run.id)).status == RunStatus.SUSPENDED
        await engine.abort_export(run.id)  # the run stays here: the cancel it deferred applies
        info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.CANCELLED


def test_new_runs_defer_a_cancel_while_frozen() -> None:
    """``for_engine`` (start, redrive, import) marks the run; its memo carries the mark
    (``TemporalEngine._defers_cancel`` reads it there)."""
    doc = StartDocument.for_engine(
        EngineSettings(driver="temporal"), 10.0, run_id="r", workflow_id="w", version="v1", graph={}
    )
    assert doc.defers_frozen_cancel and doc.memo().get("defers_frozen_cancel") is True
    assert (
        not StartDocument(run_id="r", workflow_id="w", version="v1", graph={})
        .memo()
        .get("defers_frozen_cancel")
    )


async def test_a_run_started_before_the_rule_is_cancelled_while_frozen_as_it_was(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay safety: a run started without ``defers_frozen_cancel`` keeps the old rule (its
    history holds the cancel's commands): a cancel request ends it cancelled, frozen or not."""
    made = StartDocument.for_engine

    def old_rule(settings: EngineSettings, heartbeat_timeout_s: float, **fields: Any) -> Any:
        doc = made(settings, heartbeat_timeout_s, **fields)
        return doc.model_copy(update={"defers_frozen_cancel": False})

    monkeypatch.setattr(StartDocument, "for_engine", old_rule)
    wf = _waits_for_go("mig-cancel-old")
    engine = make_engine(Registry([wf]))
    async with engine.worker():
        run = await engine.start(wf.id, {"n": 1})
        await _suspended(engine, run.id)
        await engine.export_run(run.id)
        await engine._conn.get_workflow_handle(run.id).cancel()
        info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.CANCELLED
