"""A suspension the source emitted is not emitted again by the target of a move.

b and c both wait for ``go``. On the native driver one signal wakes every stage waiting for
its name; the one that loses the signal suspends again in the very same wait, with the same
``stage.suspended`` id, which the driver finds already emitted in the run's outbox. For a run
imported suspended there the source's events are not in that outbox: the id went out a
second time, under a new sequence number (DESIGN §5: every event id is emitted once).

On Temporal an attempt exported ``running`` at a wait it had suspended in already (the
state an aborted export leaves, see ``test_migration_probe_2``) ran again as an activity, and
the one that lost the queued signal sent its suspension's id a second time."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native import _schema
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
from tests.support.moved_runs import Side
from tests.support.moved_runs import check_ids as _check_ids
from tests.support.moved_runs import flushed as _flushed
from tests.support.moved_runs import until as _until


class Doc(BaseModel):
    pass


def _pair_wait() -> Workflow[Doc]:
    wf = Workflow(f"mig-announced-{uuid.uuid4().hex[:8]}", input=Doc, version="v1")

    @wf.stage
    async def b(ctx: StageContext[Doc]) -> Any:
        return await ctx.step.wait_for_signal("go")

    @wf.stage
    async def c(ctx: StageContext[Doc]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


@asynccontextmanager
async def _sides(
    tmp_path: Path, server: Any, wf: Workflow[Doc], names: list[str]
) -> AsyncIterator[dict[str, Side]]:
    """One engine a name: ``native-*`` (a SQLite file each), ``temporal`` (on ``server``,
    the session's dev server); one blob store."""
    blobs = f"file://{tmp_path / 'blobs'}"
    sides: dict[str, Side] = {}
    for name in names:
        sink = MemorySink()
        if name == "temporal":
            settings = EngineSettings(
                driver="temporal",
                temporal_address=server.address,
                task_queue=f"ann-{uuid.uuid4().hex[:8]}",
                blob_url=blobs,
            )
            engine = create_engine(settings, Registry([wf]), event_sink=sink, signal_timeout=1.0)
        else:
            settings = EngineSettings(
                driver="native",
                database_url=f"sqlite:///{tmp_path / f'{name}.db'}",
                blob_url=blobs,
            )
            engine = create_engine(settings, Registry([wf]), event_sink=sink)
        sides[name] = Side(engine, sink)
    engines = [s.engine for s in sides.values()]
    async with engines[0], engines[1]:
        yield sides


async def _both_wait(side: Side, run_id: str) -> None:
    async def parked() -> bool:
        info = await side.engine.get_run(run_id)
        suspended = [e for e in side.sink.for_run(run_id) if e.type == "stage.suspended"]
        return info.status == RunStatus.SUSPENDED and len(suspended) >= 2

    async with side.engine.worker():
        await _until("b and c wait for go", parked)
    await _flushed(side, run_id)


async def _suspensions(side: Side, run_id: str) -> dict[str, tuple[str, int]]:
    """The native target's stage rows: status and suspensions (a stage that lost a signal
    and suspended again in its wait counts one more, whether or not it emitted anything)."""
    engine: Any = side.engine

    def read(conn: sa.Connection) -> dict[str, tuple[str, int]]:
        rows = conn.execute(sa.select(_schema.stages).where(_schema.stages.c.run_id == run_id))
        return {r.stage_id: (str(r.status), int(r.suspensions)) for r in rows}

    result: dict[str, tuple[str, int]] = await engine.kernel.db.read(read)
    return result


async def _lose_a_signal_after_a_move(tmp_path: Path, server: Any, source: str) -> None:
    """Native or Temporal -> native: b and c imported suspended in their waits, one ``go``
    after the move wakes both; the one that loses it suspends again in its wait, and sent
    the source's id of that suspension again (native -> native: seq 6 at the source, 9 at
    the target). Then a second ``go`` ends the run."""
    wf = _pair_wait()
    async with _sides(tmp_path, server, wf, [source, "native-dst"]) as sides:
        src, dst = sides[source], sides["native-dst"]
        run = await src.engine.start(wf.id, {})
        await _both_wait(src, run.id)
        move = await migrate_run(src.engine, dst.engine, run.id)
        assert move.outcome == "moved", move
        await _flushed(src, run.id)
        imported = await _suspensions(dst, run.id)
        assert {s for s, _ in imported.values()} == {StageStatus.SUSPENDED}, imported
        async with dst.engine.worker():
            await dst.engine.signal(run.id, "go", {"w": 1})

            async def lost_and_waits_again() -> bool:
                now = await _suspensions(dst, run.id)
                done = [sid for sid, (status, _) in now.items() if status == "completed"]
                again = [
                    sid
                    for sid, (status, n) in now.items()
                    if status == "suspended" and n > imported[sid][1]
                ]
                return len(done) == 1 and len(again) == 1

            # (every waiting stage woke for the signal: the one that lost it ran and
            # suspended again before the second signal is sent)
            await _until("one stage took go, the other suspended again", lost_and_waits_again)
            await dst.engine.signal(run.id, "go", {"w": 2})
            info = await dst.engine.wait(run.id, timeout=60)
            await _flushed(dst, run.id)
        events = [e for s in sides.values() for e in s.sink.for_run(run.id)]
    assert info.status == RunStatus.COMPLETED, info
    assert sorted(info.output.values(), key=str) == [{"w": 1}, {"w": 2}], info.output
    ordered = _check_ids(events)
    assert [e.type for e in ordered].count("stage.suspended") == 2, [
        (e.seq, e.type, e.stage) for e in ordered
    ]


async def test_a_stage_that_loses_a_signal_after_a_native_move_does_not_resend_its_suspension(
    tmp_path: Path,
) -> None:
    await _lose_a_signal_after_a_move(tmp_path, None, "native-src")


@pytest.mark.temporal
async def test_a_stage_that_loses_a_signal_after_a_temporal_move_does_not_resend_its_suspension(
    tmp_path: Path, temporal_server: Any
) -> None:
    await _lose_a_signal_after_a_move(tmp_path, temporal_server, "temporal")


def _running_at_their_wait(snap: RunSnapshot) -> RunSnapshot:
    """``snap`` (b and c suspended in their wait for ``go``, one ``go`` queued) with both
    attempts ``running`` at that wait after one suspension each: what an aborted export
    leaves when the signal resumed both (``test_migration_probe_2``), before the move."""
    assert [s.name for s in snap.signals] == ["go"], snap.signals
    stages = []
    for st in snap.stages:
        assert st.status == StageStatus.SUSPENDED and st.waiting_for == "signal:go", st
        stages.append(
            st.model_copy(
                update={
                    "status": StageStatus.RUNNING,
                    "suspensions": 1,
                    "waiting_for": None,
                    "wake_at": None,
                }
            )
        )
    return snap.model_copy(update={"stages": stages})


@pytest.mark.temporal
async def test_two_stages_imported_running_at_their_wait_suspend_once_each_on_temporal(
    tmp_path: Path, temporal_server: Any
) -> None:
    """Native -> Temporal with b and c exported ``running`` at their wait for ``go`` (each
    suspended there once, its ``stage.suspended`` sent at the source) and one ``go``
    queued. Both ran again at the target: the one that lost the signal suspended again in
    its wait and sent that suspension's id a second time (seq 5 and 8). Imported suspended
    in the wait, the workflow lends the signal to one of them, and the other waits."""
    wf = _pair_wait()
    async with _sides(tmp_path, temporal_server, wf, ["native-src", "temporal"]) as sides:
        src, dst = sides["native-src"], sides["temporal"]
        run = await src.engine.start(wf.id, {})
        await _both_wait(src, run.id)
        await src.engine.signal(run.id, "go", {"w": 1})  # (no worker: both jobs woken)
        snap = await src.engine.export_run(run.id)
        await dst.engine.import_run(_running_at_their_wait(snap))
        await src.engine.complete_export(run.id, "temporal")
        await _flushed(src, run.id)
        async with dst.engine.worker():

            async def one_done_one_waits() -> bool:
                info = await dst.engine.get_run(run.id)
                return sorted((s.status, s.waiting_for) for s in info.stages) == [
                    (StageStatus.COMPLETED, None),
                    (StageStatus.SUSPENDED, "signal:go"),
                ]

            # (the one that lost the signal waits for the next before it is sent)
            await _until("one stage took go, the other waits", one_done_one_waits)
            await dst.engine.signal(run.id, "go", {"w": 2})
            info = await dst.engine.wait(run.id, timeout=60)
            await _flushed(dst, run.id)
        events = [e for s in sides.values() for e in s.sink.for_run(run.id)]
    assert info.status == RunStatus.COMPLETED, info
    assert sorted(info.output.values(), key=str) == [{"w": 1}, {"w": 2}], info.output
    ordered = _check_ids(events)
    assert [e.type for e in ordered].count("stage.suspended") == 2, [
        (e.seq, e.type, e.stage) for e in ordered
    ]
