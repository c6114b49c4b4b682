"""Moving runs in and out of the native driver: freeze at a safe point and snapshot, mark
migrated, unfreeze, and import a snapshot."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port import (
    ErrorInfo,
    GraphModel,
    Lifecycle,
    RunSnapshot,
    RunStatus,
    StageStatus,
)
from engine_port.driver import (
    SnapshotSignal,
    SnapshotStage,
    SnapshotStep,
    SnapshotWait,
    announced_suspension,
    at_its_wait,
    version_key,
    wait_of_suspension,
)
from engine_port.errors import IdempotencyConflictError, MigrationError, RunExistsError

from ._outbox import append_events
from ._progress import ACTIVE, refresh_status, schedule
from ._runs import case_twin, load_graph, save_definition
from ._schema import (
    jobs,
    outbox,
    runs,
    signals,
    stage_archive,
    staged_events,
    stages,
    steps,
)
from ._sql import lock_run, try_run

__all__ = ["abort_export", "complete_export", "freeze_and_snapshot", "import_snapshot"]


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def freeze_and_snapshot(conn: Connection, run_id: str) -> RunSnapshot | None:
    """Freeze the run and snapshot it; None while a stage is running (not a safe point)."""
    run = lock_run(conn, run_id)
    _check_can_migrate(run)
    if not _freeze(conn, run_id):
        return None
    graph = load_graph(conn, run.workflow_id, run.version)
    snapshot_stages = _suspended_in(conn, run, _snapshot_stages(conn, run_id), graph)
    signal_rows = conn.execute(
        sa.select(signals).where(signals.c.run_id == run_id).order_by(signals.c.id)
    ).all()
    archive = conn.execute(sa.select(stage_archive).where(stage_archive.c.run_id == run_id)).all()
    return RunSnapshot(
        run_id=run.id,
        workflow_id=run.workflow_id,
        version=run.version,
        status=run.status,
        input=run.input,
        idempotency_key=run.idempotency_key,
        input_fingerprint=run.input_fingerprint,
        graph=None if graph is None else graph.model_dump(mode="json"),
        current_group=run.current_group,
        completed_count=run.completed_count,
        stages=snapshot_stages,
        signals=[
            SnapshotSignal(name=s.name, payload=s.payload, idempotency_key=s.idempotency_key)
            for s in signal_rows
            if not s.consumed
        ],
        signal_keys=[s.idempotency_key for s in signal_rows if s.idempotency_key is not None],
        event_seq=run.event_seq + 1,  # run.migrated takes the next number
        redrive_count=run.redrive_count,
        redrive_history=[
            {"redrive": a.redrive, "stage": a.stage_id, "record": a.record} for a in archive
        ],
        deadline=_dt(run.deadline),
        created_at=_dt(run.created_at),
        source="native",
    )


def _check_can_migrate(run: sa.Row[Any]) -> None:
    if run.status == RunStatus.MIGRATED:
        raise MigrationError(f"run {run.id!r} was already migrated to {run.migrated_to!r}")
    if run.status not in ACTIVE or run.cancel_requested:
        raise MigrationError(
            f"run {run.id!r} is {run.status}; only pending or suspended runs, or runs between "
            "stages, can migrate (terminal runs stay where they are)"
        )


def _freeze(conn: Connection, run_id: str) -> bool:
    """Park the run's jobs so no worker picks them up; False while a worker still holds one
    of them (the run is frozen all the same: what its running stage schedules next waits
    frozen instead of being handed on, so the next look finds it at a safe point; a freeze
    that is given up is undone by :func:`abort_export`)."""
    conn.execute(
        sa.update(jobs)
        .where(jobs.c.run_id == run_id, jobs.c.status.in_(("ready", "waiting")))
        .values(status="frozen")
    )
    conn.execute(sa.update(runs).where(runs.c.id == run_id).values(frozen=True))
    busy = conn.execute(
        sa.select(jobs.c.id).where(jobs.c.run_id == run_id, jobs.c.status == "leased")
    ).first()
    return busy is None


def _snapshot_stages(conn: Connection, run_id: str) -> list[SnapshotStage]:
    """Every stage of the run with its step journal and its staged business events."""
    stage_rows = conn.execute(sa.select(stages).where(stages.c.run_id == run_id)).all()
    step_rows = conn.execute(sa.select(steps).where(steps.c.run_id == run_id)).all()
    event_rows = conn.execute(
        sa.select(staged_events)
        .where(staged_events.c.run_id == run_id)
        .order_by(staged_events.c.idx)
    ).all()
    steps_of: dict[str, list[Any]] = defaultdict(list)
    for s in step_rows:
        steps_of[s.stage_id].append(s)
    events_of: dict[str, list[Any]] = defaultdict(list)
    for e in event_rows:
        events_of[e.stage_id].append(e)
    return [
        _snapshot_stage(r, steps_of.get(r.stage_id, []), events_of.get(r.stage_id, []))
        for r in stage_rows
    ]


def _suspended_in(
    conn: Connection, run: Any, snapshot_stages: list[SnapshotStage], graph: GraphModel | None
) -> list[SnapshotStage]:
    """``snapshot_stages``, each with the wait of its attempt's last ``stage.suspended``
    (``SnapshotStage.suspended_in``): the import rules read it rather than guess from the
    journal (``at_its_wait``, ``announced_suspension``).

    The last suspension the outbox holds for the stage since the run came here (after its
    last ``run.migrated``: a run that moved away and back keeps its earlier events), else the
    one the source of its import emitted (``announced_suspension``), matched to a step of
    the current attempt by its id (``wait_of_suspension``: no match, none)."""
    emitted = conn.execute(
        sa.select(outbox.c.event_id, outbox.c.type, outbox.c.stage_id, outbox.c.data)
        .where(
            outbox.c.run_id == run.id,
            outbox.c.type.in_(("stage.suspended", "run.migrated")),
        )
        .order_by(outbox.c.seq)
    ).all()
    last: dict[str, Any] = {}
    for e in emitted:
        if e.type == "run.migrated":
            last.clear()
        elif e.stage_id is not None:
            last[e.stage_id] = e
    announced = dict(
        conn.execute(
            sa.select(stages.c.stage_id, stages.c.announced_suspension).where(
                stages.c.run_id == run.id, stages.c.announced_suspension.is_not(None)
            )
        ).all()
    )
    gates = {} if graph is None else {s.id: s.after_signal for s in graph.stages}
    result = []
    for st in snapshot_stages:
        wait: SnapshotWait | None = None
        gate = gates.get(st.id)
        mine = last.get(st.id)
        if st.suspensions > 0 and mine is not None:
            data = mine.data or {}
            until = data.get("until")
            wait = wait_of_suspension(
                run.id,
                run.redrive_count,
                st,
                mine.event_id,
                until=None if until is None else datetime.fromisoformat(until),
                waiting_for=data.get("waiting_for"),
                gate=gate,
            )
        elif st.suspensions > 0 and st.id in announced:
            wait = wait_of_suspension(
                run.id,
                run.redrive_count,
                st,
                announced[st.id],
                until=st.wake_at,
                waiting_for=st.waiting_for,
                gate=gate,
            )
        result.append(st if wait is None else st.model_copy(update={"suspended_in": wait}))
    return result


def _snapshot_stage(r: Any, step_rows: list[Any], event_rows: list[Any]) -> SnapshotStage:
    return SnapshotStage(
        id=r.stage_id,
        status=r.status,
        attempt=r.attempt,
        suspensions=r.suspensions,
        output=r.output,
        has_output=bool(r.has_output),
        error=ErrorInfo.model_validate(r.error) if r.error else None,
        compensation_error=(
            ErrorInfo.model_validate(r.compensation_error) if r.compensation_error else None
        ),
        completed_order=r.completed_order,
        waiting_for=r.waiting_for,
        wake_at=_dt(r.wake_at),
        started_at=_dt(r.started_at),
        finished_at=_dt(r.finished_at),
        steps=[
            SnapshotStep(
                name=s.name,
                kind=s.kind,
                completed=bool(s.completed),
                result=s.result,
                deadline=_dt(s.deadline),
                signal=s.signal,
                meta=s.meta,
            )
            for s in step_rows
        ],
        staged_events=[{"type": e.type, "data": e.data} for e in event_rows],
    )


def complete_export(conn: Connection, run_id: str, target: str, now: float) -> None:
    run = lock_run(conn, run_id)
    if run.status == RunStatus.MIGRATED:
        return
    if not run.frozen:
        raise MigrationError(f"run {run_id!r} was not exported; call export_run first")
    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run_id))
    conn.execute(
        sa.update(runs)
        .where(runs.c.id == run_id)
        .values(
            status=RunStatus.MIGRATED,
            migrated_to=target,
            frozen=False,
            finished_at=now,
            updated_at=now,
        )
    )
    moved = Lifecycle(run.id, run.redrive_count).run_migrated(target, run.event_seq + 1)
    append_events(conn, run, [moved], now)


def abort_export(conn: Connection, run_id: str) -> None:
    lock_run(conn, run_id)
    conn.execute(
        sa.update(jobs)
        .where(jobs.c.run_id == run_id, jobs.c.status == "frozen")
        .values(status=sa.case((jobs.c.waiting_for.is_(None), "ready"), else_="waiting"))
    )
    conn.execute(sa.update(runs).where(runs.c.id == run_id).values(frozen=False))


def import_snapshot(
    conn: Connection,
    snap: RunSnapshot,
    graph: GraphModel,
    now: float,
    max_pending: int | None = None,
) -> bool:
    """Create the run from ``snap``; False when it is already here (a rerun). ``max_pending``:
    the importing engine's ``max_pending_signals``, the run's bound from now on (as a Temporal
    import starts the run with the importing engine's). A run that
    moved away from here earlier and comes back replaces what it left here (its events
    stay). A run this database is exporting is refused: the target is the source; one whose id
    differs only in case from a run here too (RunExistsError, as a chosen id at creation)."""
    existing = try_run(conn, snap.run_id)
    if existing is not None:
        if existing.frozen:
            raise MigrationError(
                f"run {snap.run_id!r} is being exported from this very database: the target "
                "is the source. Import it into another database or driver (abort_export() "
                "lets the run go on here; migrate_run does that itself)"
            )
        if existing.status != RunStatus.MIGRATED:
            return False
        _drop_left_behind(conn, snap.run_id)
    twin = case_twin(conn, snap.run_id)
    if twin is not None:  # (its blobs would share the run's folder on a case-blind store)
        raise RunExistsError(snap.run_id, twin)
    if snap.idempotency_key is not None:
        other = conn.execute(
            sa.select(runs.c.id).where(runs.c.idempotency_key == snap.idempotency_key)
        ).first()
        if other is not None:
            raise IdempotencyConflictError(snap.idempotency_key, other.id)
    save_definition(conn, graph, now)
    _insert_run(conn, snap, now, max_pending)
    _insert_stages(conn, snap, now)
    _insert_signals(conn, snap, now)
    _insert_many(
        conn,
        stage_archive,
        [
            {
                "run_id": snap.run_id,
                "redrive": entry["redrive"],
                "stage_id": entry["stage"],
                "record": entry["record"],
            }
            for entry in snap.redrive_history
        ],
    )
    run = lock_run(conn, snap.run_id)
    append_events(conn, run, schedule(conn, run, graph, now), now)
    # a run parked in a sleep or a signal wait read ``running`` here (and was missing from
    # ``list_runs(status="suspended")``) until something woke it: suspended when all its
    # jobs wait, as at the source
    refresh_status(conn, snap.run_id, now)
    return True


def _drop_left_behind(conn: Connection, run_id: str) -> None:
    """The rows a run left here when it moved away (its ``migrated`` record): it comes back
    with its whole state in the snapshot. Treating that record as "already imported" marked
    the run migrated on both sides, and nothing ran it again. Its outbox rows stay: the
    snapshot's ``event_seq`` continues after them."""
    for table in (stages, steps, signals, staged_events, jobs, stage_archive):
        conn.execute(sa.delete(table).where(table.c.run_id == run_id))
    conn.execute(sa.delete(runs).where(runs.c.id == run_id))


def _insert_run(conn: Connection, snap: RunSnapshot, now: float, max_pending: int | None) -> None:
    """The run row, running (or pending if it never started) and not frozen."""
    status = RunStatus.PENDING if snap.status == RunStatus.PENDING else RunStatus.RUNNING
    conn.execute(
        runs.insert().values(
            id=snap.run_id,
            workflow_id=snap.workflow_id,
            version=snap.version,
            status=status,
            input=snap.input,
            input_fingerprint=snap.input_fingerprint,
            idempotency_key=snap.idempotency_key,
            current_group=snap.current_group,
            event_seq=snap.event_seq,
            completed_count=snap.completed_count,
            redrive_count=snap.redrive_count,
            cancel_requested=False,
            frozen=False,
            deadline=_ts(snap.deadline),
            created_at=_ts(snap.created_at) or now,
            updated_at=now,
            max_pending_signals=max_pending,
        )
    )


def _insert_many(conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """``rows`` into ``table`` in one statement (none when there are none): an imported
    run's rows of a kind cost the same round trips whatever the run's width."""
    if rows:
        conn.execute(table.insert(), rows)


def _insert_stages(conn: Connection, snap: RunSnapshot, now: float) -> None:
    """The stage rows, their step journals, their staged business events and the jobs that
    resume them (those suspended or between attempts): one statement a table."""
    run_id = snap.run_id
    # (an attempt exported running at a wait it suspended in already is imported suspended
    # there: ``at_its_wait``)
    staged = [at_its_wait(st) for st in snap.stages]
    _insert_many(
        conn,
        stages,
        [
            {
                "run_id": run_id,
                "stage_id": st.id,
                "status": st.status,
                "attempt": st.attempt,
                "suspensions": st.suspensions,
                "output": st.output,
                "has_output": st.has_output,
                "error": None if st.error is None else st.error.model_dump(),
                "compensation_error": (
                    None if st.compensation_error is None else st.compensation_error.model_dump()
                ),
                "completed_order": st.completed_order,
                "waiting_for": st.waiting_for,
                "wake_at": _ts(st.wake_at),
                "started_at": _ts(st.started_at),
                "finished_at": _ts(st.finished_at),
                # the suspension the source emitted: one signal wakes every job waiting for
                # its name here, and a stage that loses it suspends again in the same wait
                # (``_progress._announced``)
                "announced_suspension": announced_suspension(snap, st),
            }
            for st in staged
        ],
    )
    _insert_many(
        conn,
        steps,
        [
            {
                "run_id": run_id,
                "stage_id": st.id,
                "name": s.name,
                "kind": s.kind,
                "completed": s.completed,
                "result": s.result,
                "deadline": _ts(s.deadline),
                "signal": s.signal,
                "meta": s.meta,
            }
            for st in snap.stages
            for s in st.steps
        ],
    )
    _insert_many(
        conn,
        staged_events,
        [
            {"run_id": run_id, "stage_id": st.id, "idx": i, "type": e["type"], "data": e["data"]}
            for st in snap.stages
            for i, e in enumerate(st.staged_events)
        ],
    )
    # one waiting stage woken per queued signal of its name (FIFO, as a signal here wakes
    # the oldest job first): a second stage woken for the same signal lost it and
    # suspended again in the wait it was imported in, emitting that suspension's id a
    # second time (the id names the step and its deadline) under a new sequence number
    queued = Counter(sig.name for sig in snap.signals)
    # an attempt imported running at a signal wait (one a signal had just resumed when a
    # freeze withdrew it, the signal given back to the queue) takes one of them when it runs
    # again, before any waiting stage: a waiting stage woken for it too lost it and suspended
    # again, the same way (one ``at_its_wait`` could not tell suspended there still counts)
    for st in staged:
        if st.status == StageStatus.RUNNING:
            for step in st.steps:
                if step.kind == "signal" and not step.completed and step.signal:
                    queued[step.signal] -= 1
    resumed = (_resume_job(snap, st, now, queued) for st in staged)
    _insert_many(conn, jobs, [job for job in resumed if job is not None])


def _insert_signals(conn: Connection, snap: RunSnapshot, now: float) -> None:
    """The signals still queued at the source (in arrival order: the ids keep it), and the
    idempotency keys of those it consumed: a consumed row with no name keeps a repeat of
    the key from being queued here."""
    queued_keys = {sig.idempotency_key for sig in snap.signals}
    consumed = [key for key in dict.fromkeys(snap.signal_keys) if key not in queued_keys]
    row = {"run_id": snap.run_id, "received_at": now}
    _insert_many(
        conn,
        signals,
        [
            {
                **row,
                "name": sig.name,
                "payload": sig.payload,
                "idempotency_key": sig.idempotency_key,
                "consumed": False,
            }
            for sig in snap.signals
        ]
        + [
            {**row, "name": "", "payload": None, "idempotency_key": key, "consumed": True}
            for key in consumed
        ],
    )


def _resume_job(
    snap: RunSnapshot, st: SnapshotStage, now: float, queued: Counter[str]
) -> dict[str, Any] | None:
    base = {
        "run_id": snap.run_id,
        "stage_id": st.id,
        "kind": "stage",
        "wfv": version_key(snap.workflow_id, snap.version),
        "created_at": now,
    }
    if st.status == StageStatus.SUSPENDED:
        waiting_for = st.waiting_for or ""
        buffered = False
        if waiting_for.startswith("signal:"):
            name = waiting_for.split(":", 1)[1]
            buffered = queued[name] > 0
            queued[name] -= buffered
        return {
            **base,
            "status": "ready" if buffered else "waiting",
            "available_at": now if buffered else _ts(st.wake_at),
            "waiting_for": st.waiting_for,
            "attempt": st.attempt,
        }
    # (every job the same keys: they are inserted together)
    ready = {**base, "status": "ready", "available_at": now, "waiting_for": None}
    if st.status == StageStatus.RUNNING and st.attempt > 0:
        # an attempt that started and that nobody runs at the snapshot (a lost worker's, or
        # one a freeze withdrew before any worker picked it up): it continues, journal kept
        return {**ready, "attempt": st.attempt}
    if st.status == StageStatus.PENDING and st.attempt > 0:  # a retry was scheduled
        return {**ready, "attempt": st.attempt + 1}
    return None
