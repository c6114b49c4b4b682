"""How a run moves: the transaction functions behind job.execute and run.transition.

Every function here runs inside one transaction that the kernel opened; none runs user code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql

from engine_port import (
    Abandoned,
    Completed,
    ErrorInfo,
    EventDraft,
    Failed,
    GraphModel,
    Outcome,
    RunStatus,
    StageStatus,
    Suspended,
)
from engine_port.driver import WORKING_RUN_STATUSES, version_key

from ._db import Unpredicted, commit_was_unknown, deferred, speculating
from ._jobs import Lease, held, notify_due
from ._outbox import append_events
from ._rawsql import execute, execute_many, execute_together
from ._schedule import (
    IN_CHUNK,
    Ahead,
    Begin,
    Handoff,
    attempt_started,
    lc,
    outputs_reads,
    reserve_ids,
    reserved,
    schedule,
    touch,
    upstream_outputs,
)
from ._schema import jobs, outbox, runs, signals, staged_events, stages, steps
from ._shape import GraphShape
from ._sql import (
    delete_later,
    delete_where,
    in_binds,
    in_params,
    run_and,
    select_where,
    try_run,
    try_run_query,
    update_later,
    update_where,
)

__all__ = [
    "ABANDON_BACKOFF_S",
    "COMPENSATION_RECHECK_S",
    "Begin",
    "CompensationPlan",
    "GraphShape",
    "Handoff",
    "abandon_job",
    "apply_outcome",
    "begin_attempt",
    "begin_attempts",
    "begin_compensation",
    "begin_compensation_job",
    "begin_read_ahead",
    "begin_reads",
    "finish_compensation",
    "guard_failed",
    "record_compensation",
    "refresh_status",
    "schedule",
]

ACTIVE = WORKING_RUN_STATUSES

ABANDON_BACKOFF_S = 1.0
"""How long an attempt abandoned on a storage fault waits before it runs again."""

COMPENSATION_RECHECK_S = 0.05
"""How long a compensation job that found stages of its run still running waits before it
looks again (``begin_compensation_job``)."""


@dataclass(frozen=True)
class CompensationPlan:
    run_id: str
    workflow_id: str
    version: str
    input: Any
    todo: list[tuple[str, Any]]  # (stage id, stored output) in reverse completion order
    outputs: dict[str, Any]
    trace_context: str | None = None


@functools.cache
def _held_job(postgres: bool) -> Any:
    """``_jobs.held`` on this very stage's job (ids alone can be reused)."""
    return held(postgres).where(
        jobs.c.run_id == sa.bindparam("run_id"),
        jobs.c.stage_id == sa.bindparam("stage_id"),
        jobs.c.kind == sa.bindparam("kind"),
    )


def _run_if_held(conn: Connection, job: Any, worker: str) -> Any:
    """The run row (locked), if ``job`` is still held under the claim ``worker`` made it by
    (None: the run is gone, or the lease is: another claim owns the job now, perhaps one of
    ``worker`` itself). One round trip on PostgreSQL, the job row locked FOR SHARE with it
    (``_jobs.held``): the lease cannot be taken over before this transaction ends."""
    params = {"run_id": job.run_id, "stage_id": job.stage_id, "kind": job.kind}
    owned_stmt = _held_job(conn.dialect.name == "postgresql")
    run, owned = run_and(conn, job.run_id, owned_stmt, params | Lease.of(job, worker).params())
    return None if run is None or owned.first() is None else run


@functools.cache
def _owned_stage_query(postgres: bool) -> Any:
    """The stage row (and whether it has a step ledger) of the job ``:job_id``, if the job is
    still leased under the claim ``:token`` of ``:worker``. On PostgreSQL the job row is
    locked FOR SHARE until the transaction ends, as ``_jobs.held`` does: the reaper and a
    claim lock it FOR UPDATE SKIP LOCKED and take no run lock, so a plain read would let them
    take the lease over (commit) between this check and the writes that follow it, and an
    outcome would land under a lease that is gone; locked, they skip the job until this
    transaction commits, and one that locked it first makes this check wait, then find the
    lease gone. (SQLite: writers take turns, BEGIN IMMEDIATE.)"""
    joined = stages.join(
        jobs, sa.and_(jobs.c.run_id == stages.c.run_id, jobs.c.stage_id == stages.c.stage_id)
    )
    has_steps = (
        sa.exists()
        .where(steps.c.run_id == stages.c.run_id, steps.c.stage_id == stages.c.stage_id)
        .label("has_steps")
    )
    owned = (
        sa.select(stages, has_steps)
        .select_from(joined)
        .where(
            jobs.c.id == sa.bindparam("job_id"),
            jobs.c.run_id == sa.bindparam("run_id"),
            jobs.c.stage_id == sa.bindparam("stage_id"),
            jobs.c.kind == sa.bindparam("kind"),
            jobs.c.lease_owner == sa.bindparam("worker"),
            jobs.c.lease_token == sa.bindparam("token"),
            jobs.c.status == "leased",
        )
    )
    return owned.with_for_update(read=True, of=jobs) if postgres else owned


def _owned_params(job: Any, worker: str) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "run_id": job.run_id,
        "stage_id": job.stage_id,
        "kind": job.kind,
        "worker": worker,
        "token": job.lease_token,
    }


def _upstream(
    conn: Connection, run_id: str, ids: set[str], outputs: dict[str, Any] | None
) -> dict[str, Any]:
    """The stored outputs of stages ``ids``: from ``outputs`` when read ahead (every stage
    that has one), else read now."""
    if outputs is None:
        return upstream_outputs(conn, run_id, ids)
    return {sid: outputs[sid] for sid in ids if sid in outputs}


def _run_and_owned_stage(
    conn: Connection, job: Any, worker: str, more: list[tuple[Any, dict[str, Any]]] | None = None
) -> tuple[Any, Any, list[Any]]:
    """The run row (locked) and the stage row (and whether it has a step ledger), if the job
    is still held under the claim ``worker`` made it by (ids alone can be reused; a later
    claim of ``worker`` itself has another ``lease_token``): ownership check and stage
    read in one query, sent with the run's in one round trip on PostgreSQL, with the reads
    ``more`` (their results third). The job row stays locked FOR SHARE on PostgreSQL
    (``_owned_stage_query``): the lease checked is still held when the writes land."""
    params = _owned_params(job, worker)
    owned = _owned_stage_query(conn.dialect.name == "postgresql")
    if not more:
        run, stage = run_and(conn, job.run_id, owned, params)
        return run, None if run is None else stage.first(), []
    calls = [(try_run_query(), {"k_id": job.run_id}), (owned, params)]
    got = execute_together(conn, calls + more)
    run = got[0].first()
    return run, None if run is None else got[1].first(), got[2:]


@functools.cache
def _stage_steps() -> Any:
    """The step ledger of one stage (built once)."""
    return sa.select(steps).where(
        steps.c.run_id == sa.bindparam("run_id"), steps.c.stage_id == sa.bindparam("stage_id")
    )


def _stage(conn: Connection, run_id: str, stage_id: str) -> Any:
    return select_where(conn, stages, run_id=run_id, stage_id=stage_id).first()


def _set_stage(conn: Connection, run_id: str, stage_id: str, **values: Any) -> None:
    # (nobody reads the row count: on PostgreSQL it goes out with the next statement)
    update_later(conn, stages, {"run_id": run_id, "stage_id": stage_id}, values)


def _outputs(conn: Connection, run_id: str) -> dict[str, Any]:
    rows = conn.execute(
        sa.select(stages.c.stage_id, stages.c.output).where(
            stages.c.run_id == run_id, stages.c.has_output.is_(True)
        )
    ).all()
    return {r.stage_id: r.output for r in rows}


@functools.cache
def _refresh_update() -> Any:
    """The run's status recomputed from its jobs by the database: running while a stage job
    is leased or ready (or none waits), suspended when all wait; written (with
    ``updated_at``) only when it changes and only on a running or suspended run. Two index
    probes of jobs (run_id, status), not a count of every job of a wide run."""

    def having(*statuses: str) -> Any:
        return sa.exists().where(
            jobs.c.run_id == sa.bindparam("run_id"),
            jobs.c.status.in_([sa.literal(s) for s in statuses]),  # (not expanding)
        )

    working = [sa.literal(s.value) for s in (RunStatus.RUNNING, RunStatus.SUSPENDED)]
    status = sa.case(
        (sa.or_(having("leased", "ready"), ~having("waiting")), working[0]), else_=working[1]
    )
    return (
        sa.update(runs)
        .where(
            runs.c.id == sa.bindparam("run_id"), runs.c.status.in_(working), runs.c.status != status
        )
        .values(status=status, updated_at=sa.bindparam("now", type_=runs.c.updated_at.type))
    )


def refresh_status(conn: Connection, run_id: str, now: float, status: str | None = None) -> None:
    """running while a stage job is leased or ready, suspended when all wait. ``status``:
    the run's status as this transaction left it, when the caller knows it. Decided by the
    database in one write whose result nobody reads: on PostgreSQL it goes out with the
    transaction's next statement or its commit, no round trip of its own (a sibling's
    outcome in a fan-out took three: its reads, this read of the run's jobs, the commit)."""
    if status is not None and status not in (RunStatus.RUNNING, RunStatus.SUSPENDED):
        return
    execute(conn, _refresh_update(), {"run_id": run_id, "now": now}, later=True)


def begin_attempt(
    conn: Connection, job: Any, worker: str, now: float, graph: GraphModel | GraphShape
) -> tuple[Begin | None, list[EventDraft]]:
    """Mark the stage running (emitting run.started / stage.started when they are new).
    Reads the outputs of the stage's upstream only (what ``ctx.output_of`` may read)."""
    # a stage resumed from a wait (a sleep, a signal, a poll) has a step ledger: on PostgreSQL
    # it is read in the same round trip; otherwise only if the stage row says it has one
    # (with the outputs of its upstream: the whole begin is one round trip of reads)
    ahead = conn.dialect.name == "postgresql" and getattr(job, "waiting_for", None) is not None
    if not ahead:
        run, stage, _ = _run_and_owned_stage(conn, job, worker)
        return _begin_read(conn, job, run, stage, [], None, now, graph)
    shape = graph if isinstance(graph, GraphShape) else GraphShape(graph)
    run, stage, more = _run_and_owned_stage(
        conn, job, worker, _ledger_and_outputs(job.run_id, job.stage_id, shape)
    )
    outputs = {r.stage_id: r.output for rows in more[1:] for r in rows}
    return _begin_read(conn, job, run, stage, more[:1], outputs, now, shape)


def _ledger_and_outputs(run_id: str, stage_id: str, shape: GraphShape) -> list[Any]:
    """The reads a resumed stage's begin needs besides its row: its step ledger, then the
    stored outputs of its upstream."""
    reads = [(_stage_steps(), {"run_id": run_id, "stage_id": stage_id})]
    return reads + outputs_reads(run_id, shape.upstream([stage_id]))


def begin_reads(run_id: str, stage_id: str, shape: GraphShape) -> list[Any]:
    """The reads (statement, parameters) of :func:`begin_read_ahead` for stage ``stage_id``,
    for a caller that sends them in a round trip of its own with statements they do not
    depend on: its row, its step ledger, the stored outputs of its upstream."""
    row = (_stage_row(), {"k_run_id": run_id, "k_stage_id": stage_id})
    return [row, *_ledger_and_outputs(run_id, stage_id, shape)]


def begin_read_ahead(
    conn: Connection, job: Any, run: Any, ahead: list[Any], now: float, shape: GraphShape
) -> tuple[Begin | None, list[EventDraft]]:
    """``begin_attempt`` for a job this transaction itself leased with the run row locked (a
    signal's wake), from the run row as the transaction left it and the results of
    :func:`begin_reads` for the job's stage: no round trip of reads of its own."""
    stage = ahead[0].first()
    outputs = {r.stage_id: r.output for rows in ahead[2:] for r in rows}
    return _begin_read(conn, job, run, stage, ahead[1:2], outputs, now, shape)


@functools.cache
def _stage_row() -> Any:
    """``SELECT * FROM stages WHERE run_id = :k_run_id AND stage_id = :k_stage_id``."""
    return sa.select(stages).where(
        stages.c.run_id == sa.bindparam("k_run_id"), stages.c.stage_id == sa.bindparam("k_stage_id")
    )


def begin_attempts(
    conn: Connection, claimed: list[Any], worker: str, now: float, shape: GraphShape
) -> list[Begin | None]:
    """``begin_attempt`` for several stage jobs of one run claimed together (a fan-out's
    siblings): on PostgreSQL the run lock, every job's ownership check and stage row and the
    outputs their stages may read go in one round trip, instead of two per job. The rare
    paths (a run not running, cancelled or frozen, a stage resumed from a wait) begin each
    job as ``begin_attempt`` does."""
    one_by_one = (
        conn.dialect.name != "postgresql"
        or len(claimed) < 2
        or any(getattr(j, "waiting_for", None) is not None for j in claimed)
    )
    if not one_by_one:
        run_id = claimed[0].run_id
        calls = [(try_run_query(), {"k_id": run_id})]
        owned = _owned_stage_query(True)  # (the claim locked the jobs: no lock to wait for)
        calls += [(owned, _owned_params(j, worker)) for j in claimed]
        calls += outputs_reads(run_id, shape.upstream(j.stage_id for j in claimed))
        got = execute_together(conn, calls)
        run = got[0].first()
        plain = run is not None and not run.frozen and not run.cancel_requested
        if plain and run.status == RunStatus.RUNNING:
            outputs = {r.stage_id: r.output for rows in got[1 + len(claimed) :] for r in rows}
            found = [rows.first() for rows in got[1 : 1 + len(claimed)]]
            return [
                _begin_read(conn, j, run, stage, [], outputs, now, shape)[0]
                for j, stage in zip(claimed, found, strict=True)
            ]
    return [begin_attempt(conn, j, worker, now, shape)[0] for j in claimed]


def _begin_read(
    conn: Connection,
    job: Any,
    run: Any,
    stage: Any,
    more: list[Any],
    outputs: dict[str, Any] | None,
    now: float,
    graph: GraphModel | GraphShape,
) -> tuple[Begin | None, list[EventDraft]]:
    """``begin_attempt`` once the run row (locked) and the job's stage row are read; with
    ``outputs``, the stored outputs its stage may read (read ahead with the rows)."""
    if run is None or stage is None:
        return None, []
    if run.status not in ACTIVE or run.cancel_requested:
        delete_where(conn, jobs, id=job.id)
        append_events(conn, run, _cancel_stage(conn, run, stage, now), now)
        return None, []
    if run.frozen:
        # claimed while a freeze for migration committed (it saw the job still ready): the
        # job waits frozen with the run's others, and the stage does not start here
        update_where(
            conn,
            jobs,
            {"id": job.id},
            {"status": "frozen", "lease_owner": None, "lease_expires_at": None},
        )
        return None, []
    drafts: list[EventDraft] = []
    if run.status == RunStatus.PENDING:
        drafts.append(lc(run).run_started())
    if stage.status == StageStatus.PENDING:
        attempt = job.attempt
        _set_stage(conn, run.id, stage.stage_id, **attempt_started(attempt, now))
        drafts.append(lc(run).stage_started(stage.stage_id, attempt))
    elif stage.status in (StageStatus.RUNNING, StageStatus.SUSPENDED):
        attempt = stage.attempt  # resuming (after a sleep, a signal, a poll or a crash)
        _set_stage(conn, run.id, stage.stage_id, status=StageStatus.RUNNING, waiting_for=None)
    else:
        delete_where(conn, jobs, id=job.id)
        return None, []
    run_values = {} if run.status == RunStatus.RUNNING else {"status": RunStatus.RUNNING}
    append_events(conn, run, drafts, now, **run_values)
    shape = graph if isinstance(graph, GraphShape) else GraphShape(graph)
    step_rows: list[Any] = []
    if more:
        step_rows = list(more[0])
    elif stage.has_steps:
        step_rows = list(select_where(conn, steps, run_id=run.id, stage_id=stage.stage_id).all())
    begin = Begin(
        run_id=run.id,
        workflow_id=run.workflow_id,
        version=run.version,
        stage_id=stage.stage_id,
        attempt=attempt,
        input=run.input,
        outputs=_upstream(conn, run.id, shape.upstream([stage.stage_id]), outputs),
        steps=step_rows,
        trace_context=run.trace_context,
        fresh=stage.status == StageStatus.PENDING,
        seen=(run, run_values),
    )
    return begin, drafts


def abandon_job(conn: Connection, job: Any, worker: str, available_at: float) -> bool:
    """Give back ``worker``'s lease on ``job`` at once, the job due again at ``available_at``
    with its attempt kept (an attempt abandoned on a storage fault). False if the lease is no
    longer that claim's (the outcome was recorded after all, or another claim took over)."""
    res = conn.execute(
        sa.update(jobs)
        .where(
            jobs.c.id == job.id,
            jobs.c.run_id == job.run_id,
            jobs.c.kind == job.kind,
            jobs.c.lease_owner == worker,
            jobs.c.lease_token == job.lease_token,
            jobs.c.status == "leased",
        )
        .values(status="ready", available_at=available_at, lease_owner=None, lease_expires_at=None)
    )
    return bool(res.rowcount)


def _cancel_stage(conn: Connection, run: Any, stage: Any, now: float) -> list[EventDraft]:
    if stage is None or not _stoppable(stage):
        return []
    _set_stage(
        conn,
        run.id,
        stage.stage_id,
        status=StageStatus.CANCELLED,
        finished_at=now,
        waiting_for=None,
        wake_at=None,
    )
    return [lc(run).stage_cancelled(stage.stage_id)]


def _cancel_stages(conn: Connection, run: Any, ids: list[str], now: float) -> list[EventDraft]:
    """:func:`_cancel_stage` of the stages ``ids`` (in this order), a read and an update per
    chunk of them."""
    cancelled: list[str] = []
    for at in range(0, len(ids), IN_CHUNK):
        chunk = ids[at : at + IN_CHUNK]
        rows = conn.execute(
            sa.select(stages.c.stage_id, stages.c.status, stages.c.attempt).where(
                stages.c.run_id == run.id, stages.c.stage_id.in_(chunk)
            )
        ).all()
        found = {r.stage_id: r for r in rows}
        stop = [sid for sid in chunk if sid in found and _stoppable(found[sid])]
        if stop:
            conn.execute(
                sa.update(stages)
                .where(stages.c.run_id == run.id, stages.c.stage_id.in_(stop))
                .values(
                    status=StageStatus.CANCELLED, finished_at=now, waiting_for=None, wake_at=None
                )
            )
        cancelled += stop
    return [lc(run).stage_cancelled(sid) for sid in cancelled]


def _stoppable(stage: Any) -> bool:
    """Whether cancelling ``stage`` makes it ``cancelled`` (with an event): it is running,
    suspended or waiting for a retry; a stage that never started ends skipped, silently."""
    if stage.status == StageStatus.PENDING:
        return bool(stage.attempt)
    return stage.status in (StageStatus.RUNNING, StageStatus.SUSPENDED)


@dataclass
class _Attempt:
    """One stage attempt's outcome being recorded: what the transaction read, and what it
    writes at the end (events, run-row values, whether the run's status needs a look)."""

    conn: Connection
    run: Any
    stage: Any
    job: Any
    worker: str
    now: float
    drafts: list[EventDraft] = field(default_factory=list)
    run_values: dict[str, Any] = field(default_factory=dict)
    refresh: bool = True
    due_at: float | None = None  # the job is due again then, in the future (``Handoff``)


def _complete_stage(a: _Attempt, outcome: Completed) -> None:
    """Record a returned stage body: its output and its place in completion order."""
    order = a.run.completed_count + 1
    _set_stage(
        a.conn,
        a.run.id,
        a.stage.stage_id,
        status=StageStatus.COMPLETED,
        output=outcome.output,
        has_output=True,
        finished_at=a.now,
        completed_order=order,
        waiting_for=None,
        wake_at=None,
    )
    a.run_values.update(completed_count=order, updated_at=a.now)
    delete_later(a.conn, jobs, id=a.job.id)  # (with the next statement on PostgreSQL)
    a.drafts.append(lc(a.run).stage_completed(a.stage.stage_id, a.stage.attempt))


def _on_late_completion(a: _Attempt, outcome: Completed) -> str:
    """A sibling failed for good while this body ran, and it returned before it observed
    that: its side effect happened, so the stage is completed and the compensation job
    (which waits for leased stages) undoes it first. (After a cancel a late result is
    discarded instead, SCENARIOS S10: the stage ends cancelled.)"""
    _complete_stage(a, outcome)
    a.refresh = False
    return "completed"


def _on_cancelled(a: _Attempt) -> str:
    a.drafts += _cancel_stage(a.conn, a.run, a.stage, a.now)
    delete_where(a.conn, jobs, id=a.job.id)
    return "cancelled"


@functools.cache
def _staged_insert() -> Any:
    columns = ("run_id", "stage_id", "idx", "type", "data")
    return staged_events.insert().values(
        {c: sa.bindparam(c, type_=staged_events.c[c].type) for c in columns}
    )


def _on_completed(
    a: _Attempt,
    outcome: Completed,
    shape: GraphShape,
    handoff: Handoff | None,
    ahead: Ahead | None = None,
) -> str:
    _complete_stage(a, outcome)
    # a stage completes once per redrive cycle, and redrive clears what it re-runs, so no
    # staged events of this stage exist yet
    events = [
        {"run_id": a.run.id, "stage_id": a.stage.stage_id, "idx": i, "type": e.type, "data": e.data}
        for i, e in enumerate(outcome.events)
    ]
    still_open = None if a.run.group_open is None else a.run.group_open - 1
    known, staged = None, None
    if ahead is not None and still_open == 0:
        # read in the first round trip, before this transaction completed the stage
        known = dict(ahead.rows)
        if a.stage.stage_id in known:
            known[a.stage.stage_id] = SimpleNamespace(
                stage_id=a.stage.stage_id,
                status=StageStatus.COMPLETED,
                output=outcome.output,
                has_output=True,
                job_id=None,
                has_steps=known[a.stage.stage_id].has_steps,
            )
        if ahead.staged:  # (this stage's events come last: it completed last)
            staged = ahead.staged_rows + [SimpleNamespace(**e) for e in events]
        if handoff is not None:
            handoff.reserved = ahead.reserved
    if events and staged is None:  # (with the staged events read ahead: only if kept)
        execute_many(a.conn, _staged_insert(), events, later=True)
    if still_open is not None and still_open > 0:
        # others of its group are still open (each has its job): nothing to schedule, and
        # nothing to read (the run row counts them)
        a.run_values["group_open"] = still_open
        if handoff is not None:
            handoff.quiet = handoff.finished = False
        return "completed"
    progressed = schedule(
        a.conn,
        a.run,
        shape,
        a.now,
        handoff,
        a.run_values,
        group_done=still_open == 0,
        known=known,
        staged=staged,
    )
    if events and staged is not None and a.run_values.get("status") != RunStatus.COMPLETED:
        # the run did not end here after all (its staged events were not released): keep them
        execute_many(a.conn, _staged_insert(), events, later=True)
    if handoff is not None:
        handoff.reserved = []  # (ids not used are gaps in the sequence, nothing more)
    a.drafts += progressed
    # the run moved on (finished, or handed its next stages to this worker): its status is
    # already right, so skip recomputing it
    a.refresh = not progressed
    return "completed"


def _announced(a: _Attempt, event_id: str, until: float | None) -> bool:
    """Whether the run already emitted the ``stage.suspended`` ``event_id``: the stage,
    woken for a signal another wait took first (every job waiting for a name is woken),
    suspends again in the very wait it was in (same step, same deadline), whose id is that
    of its last suspension. Emitted again under a new sequence number, a consumer
    de-duplicating by id dropped it and saw a gap. Only a stage that suspends with the
    deadline it had (its row keeps ``wake_at`` while it runs), after a suspension of the
    same attempt (the id names the attempt), can repeat one: a first suspension reads
    nothing. A stage imported suspended in a signal wait keeps the id of the suspension
    the source emitted there (``announced_suspension``, v21): the outbox here does not
    hold the source's events."""
    if getattr(a.stage, "announced_suspension", None) == event_id:
        return True
    if not a.stage.suspensions or getattr(a.stage, "wake_at", None) != until:
        return False
    found = execute(
        a.conn,
        sa.select(outbox.c.id)
        .where(outbox.c.run_id == a.run.id, outbox.c.event_id == event_id)
        .limit(1),
        {},
    ).first()
    return found is not None


def _on_suspended(a: _Attempt, outcome: Suspended) -> str:
    n = a.stage.suspensions + 1
    until = None if outcome.until is None else outcome.until.timestamp()
    _set_stage(
        a.conn,
        a.run.id,
        a.stage.stage_id,
        status=StageStatus.SUSPENDED,
        suspensions=n,
        waiting_for=outcome.waiting_for,
        wake_at=until,
    )
    draft = lc(a.run).stage_suspended(
        a.stage.stage_id,
        a.stage.attempt,
        outcome.step,
        n,
        outcome.reason,
        outcome.until,
        outcome.waiting_for,
    )
    if not _announced(a, draft.id, until):
        a.drafts.append(draft)
    ready_now = False
    if outcome.reason == "signal":
        name = outcome.waiting_for.split(":", 1)[1]
        queued = execute(a.conn, _queued_query(), {"run_id": a.run.id, "name": name}).first()
        ready_now = queued is not None
    if ready_now:
        notify_due(a.conn)
    elif until is not None:
        a.due_at = until
    # (nobody reads its row count: on PostgreSQL it goes out with the commit)
    update_later(
        a.conn,
        jobs,
        {"id": a.job.id},
        {
            "status": "ready" if ready_now else "waiting",
            "available_at": a.now if ready_now else until,
            "waiting_for": outcome.waiting_for,
            "lease_owner": None,
            "lease_expires_at": None,
        },
    )
    return "suspended"


@functools.cache
def _queued_query() -> Any:
    """A signal of this name queued for the run, not consumed yet."""
    return (
        sa.select(signals.c.id)
        .where(
            signals.c.run_id == sa.bindparam("run_id"),
            signals.c.name == sa.bindparam("name"),
            signals.c.consumed.is_(False),
        )
        .limit(1)
    )


def _on_failed(a: _Attempt, outcome: Failed, shape: GraphShape) -> str:
    spec = shape.stage(a.stage.stage_id)
    attempt = a.stage.attempt
    will_retry = outcome.retryable and attempt < spec.retry.max_attempts
    a.drafts.append(lc(a.run).stage_failed(a.stage.stage_id, attempt, outcome.error, will_retry))
    error = outcome.error.model_dump()
    if will_retry:
        _set_stage(a.conn, a.run.id, a.stage.stage_id, status=StageStatus.PENDING, error=error)
        due = a.now + spec.retry.delay_s(attempt)
        if due > a.now:
            a.due_at = due
        update_later(
            a.conn,
            jobs,
            {"id": a.job.id},
            {
                "status": "ready",
                "available_at": due,
                "attempt": attempt + 1,
                "lease_owner": None,
                "lease_expires_at": None,
                "waiting_for": None,
            },
        )
        return "retrying"
    _set_stage(
        a.conn,
        a.run.id,
        a.stage.stage_id,
        status=StageStatus.FAILED,
        error=error,
        finished_at=a.now,
    )
    delete_where(a.conn, jobs, id=a.job.id)
    touch(a.conn, a.run.id, a.now, error=error)
    append_events(a.conn, a.run, a.drafts, a.now)
    a.drafts = begin_compensation(a.conn, try_run(a.conn, a.run.id, lock=False), a.now)
    a.refresh = False  # the run is compensating now
    return "failed"


def apply_outcome(
    conn: Connection,
    job: Any,
    worker: str,
    outcome: Outcome,
    graph: GraphModel | GraphShape,
    now: float,
    cancelled: bool = False,
    handoff: Handoff | None = None,
    begun: Begin | None = None,
    ids: list[int] | None = None,
) -> str:
    """Record one stage attempt's outcome; returns what happened (for host stats).

    ``begun`` (PostgreSQL): the attempt's ``Begin``, whose ``seen`` predicts what this
    transaction would read; the common outcomes (a completion that closes its group, a
    failure retried) are then recorded without a read round trip, behind a guard that fails
    the transaction when the prediction was wrong (:func:`guard_failed`: the caller runs
    this again without ``begun``). ``ids``: job ids reserved ahead (taken from for the
    stages handed off)."""
    # (a re-run of this transaction, after a lost connection, hands off only what its own
    # try enqueued)
    _fresh_handoff(handoff)
    shape = graph if isinstance(graph, GraphShape) else GraphShape(graph)
    if begun is not None and not cancelled:
        predicted = _predicted_outcome(conn, job, worker, outcome, shape, now, handoff, begun, ids)
        if predicted is not None:
            return predicted
    ahead = None
    if isinstance(outcome, Completed) and not cancelled and conn.dialect.name == "postgresql":
        # what scheduling the next group reads, in the first round trip (PostgreSQL only: a
        # batch makes the reads free there, on SQLite each would be a statement)
        ahead = Ahead.plan(shape, job.stage_id, handoff)
    run, stage = _outcome_reads(conn, job, worker, ahead, ids)
    if run is None or stage is None:
        return "discarded"  # our lease was lost: another worker owns this stage now
    a = _Attempt(conn, run, stage, job, worker, now)
    stopping = run.status not in ACTIVE or run.cancel_requested
    failing = run.status == RunStatus.COMPENSATING and not run.cancel_requested
    if failing and isinstance(outcome, Completed):
        result = _on_late_completion(a, outcome)
    elif cancelled or stopping:
        result = _on_cancelled(a)
    elif isinstance(outcome, Completed):
        result = _on_completed(a, outcome, shape, handoff, ahead)
    elif isinstance(outcome, Abandoned):
        # the engine's storage failed during the attempt (DESIGN §5): as after a crash, the
        # stage stays running with its attempt number, no event, and the job is due again
        # after a backoff (not at lease expiry)
        abandon_job(conn, job, worker, now + ABANDON_BACKOFF_S)
        a.due_at = now + ABANDON_BACKOFF_S
        result = "abandoned"
    elif isinstance(outcome, Suspended):
        result = _on_suspended(a, outcome)
    else:
        assert isinstance(outcome, Failed)
        result = _on_failed(a, outcome, shape)
    append_events(conn, run, a.drafts, now, **a.run_values)
    if a.refresh:
        refresh_status(conn, run.id, now, a.run_values.get("status", run.status))
    if handoff is not None:
        handoff.due_at = a.due_at
    return result


_RUN_FIELDS = (
    "id",
    "workflow_id",
    "version",
    "input",
    "trace_context",
    "redrive_count",
    "status",
    "cancel_requested",
    "frozen",
    "current_group",
    "group_open",
    "completed_count",
)
"""The run row's fields an outcome predicted from its ``Begin`` may use (each either fixed
for the run, or checked by the guard)."""


class _Predicted:
    """A row as predicted: the fields given, and :class:`Unpredicted` for any other (so a
    path that would use a field nobody checked falls back to reading it)."""

    def __init__(self, **values: Any) -> None:
        # (in the instance's __dict__: a field given is read as any attribute is, at C
        # speed; only another field comes to __getattr__. A transition reads ~50 of them)
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        raise Unpredicted(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a predicted row is read-only ({name})")


def _predicted_run(seen: tuple[Any, dict[str, Any]]) -> _Predicted:
    """The run row as the transaction that began the attempt left it."""
    run, values = seen
    return _Predicted(**{f: values[f] if f in values else getattr(run, f) for f in _RUN_FIELDS})


GUARD_FAILED = "22012"
"""The SQLSTATE of an outcome's guard finding its prediction wrong (a division by zero)."""


def guard_failed(exc: BaseException) -> bool:
    """Whether a transaction failed on an outcome's guard (:func:`apply_outcome` with
    ``begun``): nothing was written, and the outcome is recorded again without it."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == GUARD_FAILED


@functools.cache
def _run_guard(grouped: bool) -> Any:
    """Fails (division by zero) unless the run is running, not cancelled nor frozen, in the
    redrive cycle and version predicted and (``grouped``) at the group counts predicted;
    locks its row FOR UPDATE first, as the reads of the slow path do (same lock order)."""
    where = [
        runs.c.id == sa.bindparam("run_id"),
        runs.c.status == sa.literal(RunStatus.RUNNING.value),
        runs.c.cancel_requested.is_(False),
        runs.c.frozen.is_(False),
        runs.c.redrive_count == sa.bindparam("redrive", type_=sa.Integer),
        runs.c.version == sa.bindparam("version", type_=sa.String),
    ]
    if grouped:
        where += [
            runs.c.current_group == sa.bindparam("group", type_=sa.Integer),
            runs.c.group_open == sa.bindparam("open", type_=sa.Integer),
            runs.c.completed_count == sa.bindparam("completed", type_=sa.Integer),
        ]
    rows = sa.select(sa.literal(1).label("one")).where(*where).with_for_update().subquery()
    return sa.select(sa.literal(1) / sa.func.count()).select_from(rows)


GUARD_LIST_SIZES = (0, 1, 2, 4, 8)
"""How many stages a guard names one parameter each: a list is padded to the next of these
(its last stage repeated: ``IN`` matches each row once), a longer one goes as one array.

PostgreSQL plans a prepared statement once (its generic plan) unless its plans for the values
given look cheaper. With ``stage_id = any($array)`` the generic plan costs an array of unknown
length (ten index probes), each custom plan the array given: on tables PostgreSQL has no
statistics of (autovacuum off, or before its first ANALYZE) past a few thousand runs, the stage
guard was planned anew at every outcome, ~0.3 ms of server CPU each
(``tests/integration/native/test_generic_plans.py``). Named one by one, the stages cost the
same in both plans, and the generic one is kept. (Sizes, not every length: at most 6 x 6 x 2
statements of the guard per connection, of the ``_pgbatch.MAX_PREPARED`` it keeps.)"""


def _guard_size(n: int) -> int:
    """The number of parameters of a guard's list of ``n`` stages (-1: one array)."""
    return next((size for size in GUARD_LIST_SIZES if size >= n), -1)


def _guard_list(name: str, size: int) -> Any:
    """The condition of a guard's list of stages ``name`` of :func:`_guard_size` ``size``."""
    if size >= 0:
        return stages.c.stage_id.in_(in_binds(size, name))
    return stages.c.stage_id == sa.func.any(sa.bindparam(name, type_=postgresql.ARRAY(sa.String)))


def _guard_values(name: str, values: list[str]) -> dict[str, Any]:
    """The parameters of :func:`_guard_list` for ``values``."""
    size = _guard_size(len(values))
    if size < 0:
        return {name: values}
    return in_params(values + values[-1:] * (size - len(values)), name)


def _stage_guard(fresh: list[str], done: list[str], last: bool) -> Any:
    """:func:`_stage_guard_of` for these lists (the statement of their sizes)."""
    return _stage_guard_of(_guard_size(len(fresh)), _guard_size(len(done)), last)


@functools.cache
def _stage_guard_of(fresh_size: int, done_size: int, last: bool) -> Any:
    """Fails (division by zero) unless the job is still held under the attempt's claim (its
    row locked FOR SHARE, as ``_owned_stage_query`` does), its stage is running the attempt
    predicted, the stages ``fresh`` are pending with no job and no step ledger, the stages
    ``done`` completed with an output, and (``last``) the run has no staged events. A list
    that is empty checks nothing; the lists' sizes (:func:`_guard_size`) make the
    statement."""
    run_id = sa.bindparam("run_id", type_=sa.String)
    held_job = (
        sa.select(sa.literal(1).label("one"))
        .where(
            jobs.c.id == sa.bindparam("job_id", type_=jobs.c.id.type),
            jobs.c.run_id == run_id,
            jobs.c.stage_id == sa.bindparam("stage_id", type_=sa.String),
            jobs.c.kind == sa.bindparam("kind", type_=sa.String),
            jobs.c.lease_owner == sa.bindparam("worker", type_=sa.String),
            jobs.c.lease_token == sa.bindparam("token", type_=sa.Integer),
            jobs.c.status == sa.literal("leased"),
        )
        .with_for_update(read=True)
        .subquery()
    )
    checks: list[Any] = [
        sa.exists().where(
            stages.c.run_id == run_id,
            stages.c.stage_id == sa.bindparam("stage_id", type_=sa.String),
            stages.c.status == sa.literal(StageStatus.RUNNING.value),
            stages.c.attempt == sa.bindparam("attempt", type_=sa.Integer),
        )
    ]

    def counted(param: str, size: int, status: StageStatus, *more: Any) -> Any:
        """How many of the stages listed in ``param`` have ``status`` (and ``more``)."""
        listed = _guard_list(param, size)
        return (
            sa.select(sa.func.count())
            .where(
                stages.c.run_id == run_id,
                listed,
                stages.c.status == sa.literal(status.value),
                *more,
            )
            .scalar_subquery()
        )

    if fresh_size:
        fresh = counted(
            "fresh",
            fresh_size,
            StageStatus.PENDING,
            ~sa.exists().where(
                jobs.c.run_id == stages.c.run_id,
                jobs.c.stage_id == stages.c.stage_id,
                jobs.c.kind == sa.literal("stage"),
            ),
            ~sa.exists().where(
                steps.c.run_id == stages.c.run_id, steps.c.stage_id == stages.c.stage_id
            ),
        )
        checks.append(fresh == sa.bindparam("n_fresh", type_=sa.Integer))
    if done_size:
        done = counted("done", done_size, StageStatus.COMPLETED, stages.c.has_output.is_(True))
        checks.append(done == sa.bindparam("n_done", type_=sa.Integer))
    if last:
        checks.append(~sa.exists().where(staged_events.c.run_id == run_id))
    return sa.select(sa.literal(1) / sa.func.count()).select_from(held_job).where(*checks)


def _fresh_row(stage_id: str) -> Any:
    return SimpleNamespace(
        stage_id=stage_id,
        status=StageStatus.PENDING,
        output=None,
        has_output=False,
        job_id=None,
        has_steps=False,
    )


def _predicted_reads(
    run: Any, job: Any, outcome: Outcome, shape: GraphShape, handoff: Handoff | None, begun: Begin
) -> tuple[Ahead | None, list[str], list[str]] | None:
    """What the reads of an outcome predicted from ``begun`` return: for a completion that
    closes its group, the ``Ahead`` rows (the stages of the next group pending and new, the
    rest among the outputs ``begun`` read), and the stages the guard checks are new
    (``fresh``) and completed (``done``); nothing to read for a failure retried. None: not a
    case predicted here."""
    if isinstance(outcome, Failed):
        retry = shape.stage(job.stage_id).retry
        if outcome.retryable and begun.attempt < retry.max_attempts:
            return None, [], []
        return None
    if not isinstance(outcome, Completed):
        return None
    group = shape.group_of(job.stage_id)
    if group is None or run.current_group != group or run.group_open != 1:
        return None  # (a sibling of a group still open: its count is not predictable)
    ahead = Ahead.plan(shape, job.stage_id, handoff)
    if ahead is None:
        return None
    mine = shape.upstream([job.stage_id])
    fresh: list[str] = []
    done: list[str] = []
    for sid in ahead.ids:
        if sid == job.stage_id:
            ahead.rows[sid] = _fresh_row(sid)  # (replaced by the completed row)
        elif sid in begun.outputs:
            done.append(sid)
            ahead.rows[sid] = SimpleNamespace(
                stage_id=sid,
                status=StageStatus.COMPLETED,
                output=begun.outputs[sid],
                has_output=True,
                job_id=None,
                has_steps=False,
            )
        elif sid not in mine and shape.group_of(sid) == group + 1:
            fresh.append(sid)
            ahead.rows[sid] = _fresh_row(sid)
        else:
            return None
    return ahead, fresh, done


def _predicted_outcome(
    conn: Connection,
    job: Any,
    worker: str,
    outcome: Outcome,
    shape: GraphShape,
    now: float,
    handoff: Handoff | None,
    begun: Begin,
    ids: list[int] | None,
) -> str | None:
    """``apply_outcome`` from what ``begun`` knew, without reading (PostgreSQL): the guards
    (deferred first), then the writes the slow path would make from those reads, all sent
    with the COMMIT. None: not a case predicted here (nothing deferred; the caller reads)."""
    if (
        begun.seen is None
        or conn.dialect.name != "postgresql"
        or commit_was_unknown()  # (a re-run after a lost commit acknowledgement: read)
        or (job.kind, job.run_id, job.stage_id) != ("stage", begun.run_id, begun.stage_id)
    ):
        return None
    run = _predicted_run(begun.seen)
    if run.status != RunStatus.RUNNING or run.cancel_requested or run.frozen:
        return None
    predicted = _predicted_reads(run, job, outcome, shape, handoff, begun)
    if predicted is None:
        return None
    ahead, fresh, done = predicted
    reserve = 0 if ahead is None else ahead.reserve
    if reserve and (ids is None or len(ids) < reserve):
        return None
    tail = deferred(conn)
    if tail is None:
        return None
    mark = len(tail)
    taken: list[int] = []
    if ahead is not None and ids is not None:
        taken = ids[:reserve]
        del ids[:reserve]  # (taken, used or not: an id not used is a gap, nothing more)
        ahead.reserved = [(i, None) for i in taken]
    _guard(conn, run, job, worker, begun.attempt, ahead, fresh, done)
    stage = _Predicted(stage_id=job.stage_id, attempt=begun.attempt, status=StageStatus.RUNNING)
    a = _Attempt(conn, run, stage, job, worker, now)
    try:
        with speculating(conn):
            if isinstance(outcome, Completed):
                result = _on_completed(a, outcome, shape, handoff, ahead)
            else:
                assert isinstance(outcome, Failed)
                result = _on_failed(a, outcome, shape)
            append_events(conn, run, a.drafts, now, **a.run_values)
            if a.refresh:
                refresh_status(conn, run.id, now, a.run_values.get("status", run.status))
    except Unpredicted:
        del tail[mark:]  # (nothing of it was sent)
        if ids is not None:
            ids[:0] = taken
        _fresh_handoff(handoff)
        return None
    if handoff is not None:
        handoff.due_at = a.due_at
    return result


def _guard(
    conn: Connection,
    run: Any,
    job: Any,
    worker: str,
    attempt: int,
    ahead: Ahead | None,
    fresh: list[str],
    done: list[str],
) -> None:
    """Defer the guards of a predicted outcome (before its writes: they lock the run row,
    then the job's, as the slow path's reads do)."""
    guard = {"run_id": run.id, "redrive": run.redrive_count, "version": run.version}
    if ahead is not None:
        guard |= {"group": run.current_group, "open": 1, "completed": run.completed_count}
    execute(conn, _run_guard(ahead is not None), guard, later=True)
    last = bool(ahead is not None and ahead.staged)
    held_params = {
        "job_id": job.id,
        "run_id": run.id,
        "stage_id": job.stage_id,
        "kind": job.kind,
        "worker": worker,
        "token": job.lease_token,
        "attempt": attempt,
        "n_fresh": len(fresh),
        "n_done": len(done),
        **_guard_values("fresh", fresh),
        **_guard_values("done", done),
    }
    execute(conn, _stage_guard(fresh, done, last), held_params, later=True)


def _fresh_handoff(handoff: Handoff | None) -> None:
    """Forget what a try of an outcome's transaction handed off (a re-run, a prediction
    given up): only the try that commits hands off."""
    if handoff is not None:
        handoff.jobs.clear()
        handoff.reserved = []
        handoff.quiet = handoff.finished = False
        handoff.due_at = None


IDS_LOW = 4
"""Job ids left ahead (PostgreSQL) below which an outcome that reads first reserves
``IDS_AHEAD`` more in its round trip of reads: a predicted outcome that hands stages off
takes theirs from there (it has no read to take them with)."""

IDS_AHEAD = 32


def _outcome_reads(
    conn: Connection, job: Any, worker: str, ahead: Ahead | None, ids: list[int] | None
) -> tuple[Any, Any]:
    """The run row (locked) and the job's stage row, if still held, with the reads
    ``ahead`` (kept there) and, when ``ids`` runs low, more job ids (kept there)."""
    if ahead is None:
        run, stage, _ = _run_and_owned_stage(conn, job, worker)
        return run, stage
    reads = ahead.calls(job.run_id)
    refill = ids is not None and len(ids) < IDS_LOW
    if refill:
        reads.append(reserve_ids(IDS_AHEAD))  # (last: taken off before ``ahead.took``)
    run, stage, more = _run_and_owned_stage(conn, job, worker, reads)
    if refill and ids is not None:
        ids += [i for i, _ in reserved(more.pop())]
    ahead.took(more)
    return run, stage


def begin_compensation(conn: Connection, run: Any, now: float) -> list[EventDraft]:
    """Stop the run's other stages and enqueue its compensation job. The stage jobs no worker
    holds are deleted and their stages cancelled in a few statements whatever their number
    (a wide group's queue was two round trips a job); a leased job's worker sees the run
    compensating and cancels its stage itself."""
    drafts = _stop_idle_stages(conn, run, now)
    touch(conn, run.id, now, status=RunStatus.COMPENSATING)
    exists = conn.execute(
        sa.select(jobs.c.id).where(jobs.c.run_id == run.id, jobs.c.kind == "compensate")
    ).first()
    if exists is None:
        notify_due(conn)
        conn.execute(
            jobs.insert().values(
                run_id=run.id,
                stage_id="*",
                kind="compensate",
                wfv=version_key(run.workflow_id, run.version),
                status="ready",
                available_at=now,
                attempt=1,
                created_at=now,
            )
        )
    return drafts


def _stop_idle_stages(conn: Connection, run: Any, now: float) -> list[EventDraft]:
    """Delete the run's stage jobs no worker holds and cancel their stages."""
    gone = conn.execute(
        sa.delete(jobs)
        .where(jobs.c.run_id == run.id, jobs.c.kind == "stage", jobs.c.status != "leased")
        .returning(jobs.c.id, jobs.c.stage_id)
    ).all()
    ids = list(dict.fromkeys(r.stage_id for r in sorted(gone, key=lambda r: r.id)))
    return _cancel_stages(conn, run, ids, now)


def begin_compensation_job(
    conn: Connection, job: Any, worker: str, graph: GraphModel, now: float
) -> CompensationPlan | None:
    """The stages to compensate, newest first; None (rescheduled) while stages still run."""
    run = _run_if_held(conn, job, worker)
    if run is None:
        return None
    busy = conn.execute(
        sa.select(jobs.c.id).where(
            jobs.c.run_id == run.id, jobs.c.kind == "stage", jobs.c.status == "leased"
        )
    ).first()
    if busy is not None:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == job.id)
            .values(
                status="ready",
                available_at=now + COMPENSATION_RECHECK_S,
                lease_owner=None,
                lease_expires_at=None,
            )
        )
        return None
    # a stage job taken back from an expired lease since the compensation began (its
    # worker stalled) is ready again with its stage still running: stopped here, as the
    # compensation's beginning stopped the idle ones, or the run would end with it running
    append_events(conn, run, _stop_idle_stages(conn, run, now), now)
    compensable = {s.id for s in graph.stages if s.compensable}
    rows = conn.execute(
        sa.select(stages)
        .where(
            stages.c.run_id == run.id,
            stages.c.status == StageStatus.COMPLETED,
            stages.c.compensation_error.is_(None),
        )
        .order_by(stages.c.completed_order.desc())
    ).all()
    return CompensationPlan(
        run_id=run.id,
        workflow_id=run.workflow_id,
        version=run.version,
        input=run.input,
        todo=[(r.stage_id, r.output) for r in rows if r.stage_id in compensable],
        outputs=_outputs(conn, run.id),
        trace_context=run.trace_context,
    )


def record_compensation(
    conn: Connection, job: Any, worker: str, stage_id: str, error: ErrorInfo | None, now: float
) -> bool:
    """Record stage ``stage_id``'s compensation (``error``: it failed for good), if the
    compensation ``job`` is still held under the claim ``worker`` made it by; False (nothing
    written) if not: the job is another claim's now, which compensates from here.

    Once per (run, stage, claim): a re-run after a commit whose acknowledgement was lost
    finds the compensation recorded by that commit and writes nothing (no second event with
    the same id, nor a second compensation error), and returns
    True as that commit did. A recorded compensation is this claim's own: the plan holds only
    stages not recorded yet, only the claim's holder records, and a redrive (which clears
    them) needs the run ended."""
    run = _run_if_held(conn, job, worker)
    if run is None:
        return False
    run_id = run.id
    if commit_was_unknown() and _compensation_recorded(conn, run_id, stage_id):
        return True
    if error is None:
        _set_stage(conn, run_id, stage_id, status=StageStatus.COMPENSATED)
        append_events(conn, run, [lc(run).stage_compensated(stage_id)], now)
    else:
        _set_stage(conn, run_id, stage_id, compensation_error=error.model_dump())
        errors = list(run.compensation_errors or [])
        errors.append(error.model_dump())
        touch(conn, run_id, now, compensation_errors=errors)
    return True


def _compensation_recorded(conn: Connection, run_id: str, stage_id: str) -> bool:
    """Whether stage ``stage_id``'s compensation is recorded: compensated, or failed for good
    (its error kept)."""
    stage = _stage(conn, run_id, stage_id)
    return stage is not None and (
        stage.status == StageStatus.COMPENSATED or stage.compensation_error is not None
    )


def _ended(conn: Connection, run_id: str) -> bool:
    run = try_run(conn, run_id, lock=False)
    return run is not None and run.status in (RunStatus.FAILED, RunStatus.CANCELLED)


def finish_compensation(conn: Connection, job: Any, worker: str, now: float) -> bool:
    """End the compensated run (failed, or cancelled); False (nothing written) if ``job`` is
    no longer held under the claim ``worker`` made it by."""
    run = _run_if_held(conn, job, worker)
    if run is None:
        # a re-run after a commit whose acknowledgement was lost: that commit ended the run
        # (and deleted the job), it did not lose the lease
        return commit_was_unknown() and _ended(conn, job.run_id)
    life = lc(run)
    conn.execute(
        sa.update(stages)
        .where(stages.c.run_id == run.id, stages.c.status == StageStatus.PENDING)
        .values(status=StageStatus.SKIPPED)
    )
    conn.execute(sa.delete(staged_events).where(staged_events.c.run_id == run.id))
    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run.id))
    if run.cancel_requested:
        status, draft = RunStatus.CANCELLED, life.run_cancelled()
    else:
        error = (
            ErrorInfo.model_validate(run.error)
            if run.error
            else ErrorInfo(type="EngineError", message="run failed")
        )
        status, draft = RunStatus.FAILED, life.run_failed(error)
    touch(conn, run.id, now, status=status, finished_at=now)
    append_events(conn, run, [draft], now)
    return True
