"""Stages exported ``running`` at a signal wait they had suspended in already, when the
wait is not the only one their journal holds (``nap``: a completed sleep before the wait) or
is not journaled at all (``gate``: an ``after_signal=`` gate without a timeout).

b and c both wait for ``go``; one ``go`` resumed both (a Temporal source lends it to one
waiter, a freeze withdraws that attempt and gives the signal back, an aborted export lets it
resume the other: ``test_migration_probe_2``), and the move exports both ``running`` at
their wait with one ``go`` queued. The import rules (``engine_port._imported``) took the
journal for the only witness: with a second wait step in it, or none, they could not tell
that the attempt had suspended in this wait, and kept it ``running``. Both ran again at
the target, and the one that lost the signal suspended again in the same wait and sent
that suspension's id, already sent at the source, a second time under a new sequence
number (DESIGN §5: every event id is emitted once, with one sequence number).

What a user of the event sink sees is checked: no event id with two sequence numbers, the
run's events numbered without a gap, and the run completes once a second ``go`` is sent."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_temporal import _moving
from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    RunSnapshot,
    RunStatus,
    StageContext,
    StageStatus,
    Workflow,
    create_engine,
    migrate_run,
)
from engine_port.driver import SnapshotWait
from tests.support.moved_runs import Side
from tests.support.moved_runs import check_ids as _check_ids
from tests.support.moved_runs import flushed as _flushed
from tests.support.moved_runs import until as _until


class Doc(BaseModel):
    pass


def _pair(shape: str) -> Workflow[Doc]:
    """b and c wait for ``go``: after a nap (``nap``), or at their ``after_signal`` gate
    (``gate``, no timeout: nothing journaled while they wait)."""
    wf = Workflow(f"mig-suspended-in-{shape}-{uuid.uuid4().hex[:8]}", input=Doc, version="v1")
    if shape == "nap":

        @wf.stage
        async def b(ctx: StageContext[Doc]) -> Any:
            await ctx.step.sleep("nap", 0.01)
            return await ctx.step.wait_for_signal("go")

        @wf.stage
        async def c(ctx: StageContext[Doc]) -> Any:
            await ctx.step.sleep("nap", 0.01)
            return await ctx.step.wait_for_signal("go")

    else:

        @wf.stage(after_signal="go")
        async def b(ctx: StageContext[Doc]) -> Any:
            return await ctx.step.wait_for_signal("go")

        @wf.stage(after_signal="go")
        async def c(ctx: StageContext[Doc]) -> Any:
            return await ctx.step.wait_for_signal("go")

    return wf


def _side(wf: Workflow[Doc], blobs: str, url: str | None, server: Any) -> Side:
    """A native engine on ``url``, or a Temporal one on ``server`` (``url`` None)."""
    sink = MemorySink()
    if url is None:
        settings = EngineSettings(
            driver="temporal",
            temporal_address=server.address,
            task_queue=f"sin-{uuid.uuid4().hex[:8]}",
            blob_url=blobs,
        )
        return Side(
            create_engine(settings, Registry([wf]), event_sink=sink, signal_timeout=1.0), sink
        )
    settings = EngineSettings(driver="native", database_url=url, blob_url=blobs)
    return Side(create_engine(settings, Registry([wf]), event_sink=sink), sink)


@asynccontextmanager
async def _sides(
    tmp_path: Path, wf: Workflow[Doc], src_url: str | None, dst_url: str | None, server: Any
) -> AsyncIterator[tuple[Side, Side]]:
    blobs = f"file://{tmp_path / 'blobs'}"
    src, dst = _side(wf, blobs, src_url, server), _side(wf, blobs, dst_url, server)
    async with src.engine, dst.engine:
        yield src, dst


async def _both_wait(side: Side, run_id: str) -> None:
    """b and c suspended in their wait for ``go`` (every event delivered)."""

    async def parked() -> bool:
        info = await side.engine.get_run(run_id)
        return (
            info.status == RunStatus.SUSPENDED
            and [(s.status, s.waiting_for) for s in info.stages]
            == [(StageStatus.SUSPENDED, "signal:go")] * 2
        )

    async with side.engine.worker():
        await _until("b and c wait for go", parked)
    await _flushed(side, run_id)


def _running_at_their_wait(snap: RunSnapshot) -> RunSnapshot:
    """``snap`` (b and c suspended in their wait for ``go``, one ``go`` queued) with both
    attempts ``running`` at that wait, every other field as exported: what a Temporal
    source exports when a signal resumed both (a freeze withdrew the attempt the signal
    resumed, an aborted export let it resume the other), before the move."""
    assert [s.name for s in snap.signals] == ["go"], snap.signals
    stages = []
    for st in snap.stages:
        assert st.status == StageStatus.SUSPENDED and st.waiting_for == "signal:go", st
        stages.append(
            st.model_copy(
                update={"status": StageStatus.RUNNING, "waiting_for": None, "wake_at": None}
            )
        )
    return snap.model_copy(update={"stages": stages})


async def _finish(src: Side, dst: Side, run_id: str, shape: str, also: Side | None = None) -> None:
    """At the target: one ``go`` queued; once one stage took it and the other waits, a
    second ``go`` ends the run. No id reached a sink with two sequence numbers (``also``:
    a third engine the run went through)."""
    async with dst.engine.worker():

        async def one_done_one_waits() -> bool:
            info = await dst.engine.get_run(run_id)
            return sorted((s.status, s.waiting_for) for s in info.stages) == [
                (StageStatus.COMPLETED, None),
                (StageStatus.SUSPENDED, "signal:go"),
            ]

        # (the one that lost the signal waits for the next before it is sent)
        await _until("one stage took go, the other waits", one_done_one_waits)
        await dst.engine.signal(run_id, "go", {"w": 2})
        info = await dst.engine.wait(run_id, timeout=60)
        await _flushed(dst, run_id)
    events = src.sink.for_run(run_id) + dst.sink.for_run(run_id)
    if also is not None:
        events += also.sink.for_run(run_id)
    assert info.status == RunStatus.COMPLETED, info
    assert sorted(info.output.values(), key=str) == [{"w": 1}, {"w": 2}], info.output
    ordered = _check_ids(events)
    suspended = [e.stage for e in ordered if e.type == "stage.suspended"]
    # (nap: each stage suspended in its nap and in its wait, once each)
    assert sorted(suspended) == sorted(["b", "c"] * (2 if shape == "nap" else 1)), [
        (e.seq, e.type, e.stage) for e in ordered
    ]


async def _edited_move(src: Side, dst: Side, wf: Workflow[Doc], shape: str) -> None:
    """Native source, b and c waiting for ``go``; one ``go`` sent with no worker up; the
    export edited into both attempts ``running`` at their wait, imported into ``dst``."""
    run = await src.engine.start(wf.id, {})
    await _both_wait(src, run.id)
    await src.engine.signal(run.id, "go", {"w": 1})  # (no worker: both jobs woken)
    snap = await src.engine.export_run(run.id)
    await dst.engine.import_run(_running_at_their_wait(snap))
    await src.engine.complete_export(run.id, "target")
    await _flushed(src, run.id)
    await _finish(src, dst, run.id, shape)


@pytest.mark.parametrize("shape", ["nap", "gate"])
async def test_stages_imported_running_at_their_wait_suspend_once_each_on_native(
    tmp_path: Path, database_url: str, shape: str
) -> None:
    """Native -> native (SQLite or PostgreSQL target)."""
    wf = _pair(shape)
    src_url = f"sqlite:///{tmp_path / 'src.db'}"
    async with _sides(tmp_path, wf, src_url, database_url, None) as (src, dst):
        await _edited_move(src, dst, wf, shape)


@pytest.mark.temporal
@pytest.mark.parametrize("shape", ["nap", "gate"])
async def test_stages_imported_running_at_their_wait_suspend_once_each_on_temporal(
    tmp_path: Path, temporal_server: Any, shape: str
) -> None:
    """Native -> Temporal."""
    wf = _pair(shape)
    src_url = f"sqlite:///{tmp_path / 'src.db'}"
    async with _sides(tmp_path, wf, src_url, None, temporal_server) as (src, dst):
        await _edited_move(src, dst, wf, shape)


_SIGNALED = "workflow_execution_signaled_event_attributes"
_TASK_COMPLETED = "workflow_task_completed_event_attributes"


async def _left_running_at_their_wait(side: Side, run_id: str, wf: Workflow[Doc]) -> None:
    """On a Temporal ``side`` whose run has b and c waiting for ``go``: one ``go`` sent with
    no worker up, a migration helper runs the signal's workflow task (the signal resumes
    one stage), an export withdraws that attempt and is aborted (the signal, given back,
    resumes the other as well): both ``running`` at their wait, the ``go`` queued."""
    await side.engine.signal(run_id, "go", {"w": 1})
    engine: Any = side.engine
    await _moving.helper(engine, wf.id, "v1")
    handle = engine._conn.get_workflow_handle(run_id)

    async def signal_handled() -> bool:
        events = list((await handle.fetch_history()).events)
        at = max(i for i, e in enumerate(events) if e.HasField(_SIGNALED))
        return any(e.HasField(_TASK_COMPLETED) for e in events[at:])

    await _until("the signal's workflow task completed", signal_handled)
    await side.engine.export_run(run_id, wait=30)
    await side.engine.abort_export(run_id)

    async def both_resumed() -> bool:
        info = await side.engine.get_run(run_id)
        return [s.status for s in info.stages] == ["running", "running"]

    await _until("the signal resumed both", both_resumed)


@pytest.mark.temporal
@pytest.mark.parametrize("shape", ["nap", "gate"])
async def test_stages_a_temporal_export_left_running_at_their_wait_suspend_once_each(
    tmp_path: Path, temporal_server: Any, database_url: str, shape: str
) -> None:
    """Temporal -> native (SQLite or PostgreSQL), the state itself, not an edit
    (``_left_running_at_their_wait``)."""
    wf = _pair(shape)
    async with _sides(tmp_path, wf, None, database_url, temporal_server) as (src, dst):
        run = await src.engine.start(wf.id, {})
        await _both_wait(src, run.id)
        await _left_running_at_their_wait(src, run.id, wf)
        move = await migrate_run(src.engine, dst.engine, run.id)
        assert move.outcome == "moved", move
        await _flushed(src, run.id)
        await _finish(src, dst, run.id, shape)


@pytest.mark.temporal
@pytest.mark.parametrize("shape", ["nap", "gate"])
async def test_stages_imported_suspended_then_left_running_on_temporal_suspend_once_each(
    tmp_path: Path, temporal_server: Any, shape: str
) -> None:
    """Native -> Temporal -> native: b and c imported suspended in their wait into
    Temporal (the workflow did not see them suspend: it reads the wait from the journal,
    ``current_wait``), left ``running`` at it there, and moved on to a native target."""
    wf = _pair(shape)
    blobs = f"file://{tmp_path / 'blobs'}"
    first = _side(wf, blobs, f"sqlite:///{tmp_path / 'first.db'}", None)
    temporal = _side(wf, blobs, None, temporal_server)
    last = _side(wf, blobs, f"sqlite:///{tmp_path / 'last.db'}", None)
    async with first.engine, temporal.engine, last.engine:
        run = await first.engine.start(wf.id, {})
        await _both_wait(first, run.id)
        move = await migrate_run(first.engine, temporal.engine, run.id)
        assert move.outcome == "moved", move
        await _flushed(first, run.id)
        await _left_running_at_their_wait(temporal, run.id, wf)
        move = await migrate_run(temporal.engine, last.engine, run.id)
        assert move.outcome == "moved", move
        await _flushed(temporal, run.id)
        await _finish(first, last, run.id, shape, also=temporal)


@pytest.mark.parametrize("shape", ["nap", "gate"])
async def test_a_native_export_says_where_each_attempt_last_suspended(
    tmp_path: Path, database_url: str, shape: str
) -> None:
    """``suspended_in`` of a native export: from the stage's last ``stage.suspended`` in
    the outbox, and for a stage imported suspended (nothing emitted here since), the one
    the source emitted (``announced_suspension``), also on the engine a run came back to
    (the outbox events it emitted there before it moved away are not read)."""
    wf = _pair(shape)
    blobs = f"file://{tmp_path / 'blobs'}"
    a = _side(wf, blobs, f"sqlite:///{tmp_path / 'a.db'}", None)
    b = _side(wf, blobs, database_url, None)
    async with a.engine, b.engine:
        run = await a.engine.start(wf.id, {})
        await _both_wait(a, run.id)
        for src, dst in ((a, b), (b, a), (a, b)):
            snap = await src.engine.export_run(run.id)
            assert [s.suspended_in for s in snap.stages] == [
                SnapshotWait(step="go", waiting_for="signal:go")
            ] * 2, snap.stages
            move = await migrate_run(src.engine, dst.engine, run.id)
            assert move.outcome == "moved", move
        async with b.engine.worker():
            await b.engine.signal(run.id, "go", {"w": 1})
            await b.engine.signal(run.id, "go", {"w": 2})
            info = await b.engine.wait(run.id, timeout=60)
            await _flushed(b, run.id)
        await _flushed(a, run.id)
        assert info.status == RunStatus.COMPLETED, info
        _check_ids(a.sink.for_run(run.id) + b.sink.for_run(run.id))
