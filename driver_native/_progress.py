"""How a run moves: the transaction functions behind job.execute and run.transition.

Every function here runs inside one transaction that the kernel opened; none runs user code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port import (
    Abandoned,
    Completed,
    ErrorInfo,
    EventDraft,
    Failed,
    GraphModel,
    Lifecycle,
    Outcome,
    RunStatus,
    StageStatus,
    Suspended,
    run_output,
)
from engine_port.driver import WORKING_RUN_STATUSES, version_key

from ._db import defer
from ._jobs import notify_due
from ._outbox import append_events
from ._schema import jobs, runs, signals, staged_events, stages, steps
from ._sql import (
    db_clock,
    db_clock_sql,
    delete_later,
    delete_where,
    select_where,
    try_run,
    update_later,
    update_where,
)

__all__ = [
    "ABANDON_BACKOFF_S",
    "Begin",
    "CompensationPlan",
    "Handoff",
    "abandon_job",
    "apply_outcome",
    "begin_attempt",
    "begin_compensation",
    "begin_compensation_job",
    "finish_compensation",
    "record_compensation",
    "schedule",
]

ACTIVE = WORKING_RUN_STATUSES

ABANDON_BACKOFF_S = 1.0
"""How long an attempt abandoned on a storage fault waits before it runs again."""


@dataclass(frozen=True)
class Begin:
    """What job.execute needs to run one stage attempt outside the transaction."""

    run_id: str
    workflow_id: str
    version: str
    stage_id: str
    attempt: int
    input: Any
    outputs: dict[str, Any]  # stage id -> stored output (maybe a spill reference)
    steps: list[Any] = field(default_factory=list)
    trace_context: str | None = None


@dataclass
class Handoff:
    """Jobs a transition enqueues may be leased at once to the worker that made it (up to
    ``limit``), so it runs the next stage without a round trip through the queue."""

    worker: str
    lease: float
    limit: int
    jobs: list[tuple[Any, Begin]] = field(default_factory=list)  # already marked running
    # the transition left nothing for the queue: it finished the run, or every job it
    # enqueued is in ``jobs`` (the host need not look for work)
    quiet: bool = False
    finished: bool = False  # the transition ended the run (completed)


@dataclass(frozen=True)
class CompensationPlan:
    run_id: str
    workflow_id: str
    version: str
    input: Any
    todo: list[tuple[str, Any]]  # (stage id, stored output) in reverse completion order
    outputs: dict[str, Any]
    trace_context: str | None = None


def _lc(run: Any) -> Lifecycle:
    return Lifecycle(run.id, run.redrive_count)


def _owns(conn: Connection, job: Any, worker: str) -> bool:
    """The job row is still ``worker``'s lease on this very stage (ids alone can be reused)."""
    row = select_where(
        conn,
        jobs,
        id=job.id,
        run_id=job.run_id,
        stage_id=job.stage_id,
        kind=job.kind,
        lease_owner=worker,
        status="leased",
    ).first()
    return row is not None


@functools.cache
def _owned_stage_query() -> Any:
    joined = stages.join(
        jobs, sa.and_(jobs.c.run_id == stages.c.run_id, jobs.c.stage_id == stages.c.stage_id)
    )
    return (
        sa.select(stages)
        .select_from(joined)
        .where(
            jobs.c.id == sa.bindparam("job_id"),
            jobs.c.run_id == sa.bindparam("run_id"),
            jobs.c.stage_id == sa.bindparam("stage_id"),
            jobs.c.kind == sa.bindparam("kind"),
            jobs.c.lease_owner == sa.bindparam("worker"),
            jobs.c.status == "leased",
        )
    )


def _owned_stage(conn: Connection, job: Any, worker: str) -> Any:
    """The stage row, if the job is still ``worker``'s lease on it (ids alone can be reused);
    ownership check and stage read in one query."""
    params = {
        "job_id": job.id,
        "run_id": job.run_id,
        "stage_id": job.stage_id,
        "kind": job.kind,
        "worker": worker,
    }
    return conn.execute(_owned_stage_query(), params).first()


def _touch(conn: Connection, run_id: str, now: float, **values: Any) -> None:
    update_later(conn, runs, {"id": run_id}, {"updated_at": now, **values})


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


def refresh_status(conn: Connection, run_id: str, now: float) -> None:
    """running while a stage job is leased or ready, suspended when all wait."""
    run = try_run(conn, run_id, lock=False)
    if run is None or run.status not in (RunStatus.RUNNING, RunStatus.SUSPENDED):
        return
    counts: dict[str, int] = dict(
        conn.execute(
            sa.select(jobs.c.status, sa.func.count())
            .where(jobs.c.run_id == run_id)
            .group_by(jobs.c.status)
        ).all()
    )
    busy = counts.get("leased", 0) + counts.get("ready", 0)
    status = RunStatus.RUNNING if busy or not counts.get("waiting") else RunStatus.SUSPENDED
    if status != run.status:
        _touch(conn, run_id, now, status=status)


@functools.cache
def _state_query() -> Any:
    has_steps = (
        sa.exists()
        .where(steps.c.run_id == stages.c.run_id, steps.c.stage_id == stages.c.stage_id)
        .label("has_steps")
    )
    joined = stages.outerjoin(
        jobs,
        sa.and_(
            jobs.c.run_id == stages.c.run_id,
            jobs.c.stage_id == stages.c.stage_id,
            jobs.c.kind == "stage",
        ),
    )
    return (
        sa.select(
            stages.c.stage_id,
            stages.c.status,
            stages.c.output,
            stages.c.has_output,
            jobs.c.id.label("job_id"),
            has_steps,
        )
        .select_from(joined)
        .where(stages.c.run_id == sa.bindparam("run_id"))
    )


def _load_state(conn: Connection, run_id: str) -> dict[str, Any]:
    """Every stage of the run with its status, output and whether it has a job: one query."""
    return {r.stage_id: r for r in conn.execute(_state_query(), {"run_id": run_id})}


def schedule(
    conn: Connection,
    run: Any,
    graph: GraphModel,
    now: float,
    handoff: Handoff | None = None,
    run_values: dict[str, Any] | None = None,
) -> list[EventDraft]:
    """Enqueue the first group with unfinished stages; finish the run when none is left.
    With ``run_values``, run-row changes are collected there for the caller's one update."""
    state = _load_state(conn, run.id)
    group = run.current_group
    values: dict[str, Any] = run_values if run_values is not None else {}
    drafts: list[EventDraft] = []
    if handoff is not None:
        handoff.quiet = handoff.finished = False
    while group < len(graph.groups):
        open_stages = [
            sid for sid in graph.groups[group] if state[sid].status != StageStatus.COMPLETED
        ]
        if open_stages:
            new = [s for s in sorted(open_stages) if state[s].job_id is None]
            take = set(new[: handoff.limit]) if handoff is not None else set()
            postgres = conn.dialect.name == "postgresql"
            lease_until = None
            if take and handoff is not None and not postgres:
                lease_until = _lease_deadline(conn, handoff.lease, now)
            rows = [
                {
                    "run_id": run.id,
                    "stage_id": s,
                    "kind": "stage",
                    "wfv": version_key(run.workflow_id, run.version),
                    "status": "leased" if s in take else "ready",
                    "lease_owner": handoff.worker if handoff and s in take else None,
                    # (on PostgreSQL: the database clock + "lease_for", in the insert)
                    ("lease_for" if postgres else "lease_expires_at"): (
                        (handoff.lease if postgres else lease_until)
                        if handoff and s in take
                        else None
                    ),
                    "available_at": now,
                    "attempt": 1,
                    "created_at": now,
                }
                for s in new
            ]
            if rows:
                inserted = conn.execute(_jobs_insert(postgres), rows).all()
                if len(take) < len(rows):
                    notify_due(conn)  # jobs left for the queue: wake other processes
                if take and handoff is not None:
                    handed = [j for j in inserted if j.stage_id in take]
                    drafts = _begin_handed(conn, run, handed, handoff, state, now)
                    if run.status == RunStatus.PENDING:  # handed from its creation
                        drafts.insert(0, _lc(run).run_started())
                        values["status"] = RunStatus.RUNNING
            if handoff is not None:
                handoff.quiet = len(take) == len(new)
            if group != run.current_group:
                values["current_group"] = group
            break
        group += 1
    else:
        drafts = _finish_completed(conn, run, graph, state, now, values)
        if handoff is not None:
            handoff.quiet = handoff.finished = True
    if run_values is None and values:
        _touch(conn, run.id, now, **values)
    return drafts


def _begin_handed(
    conn: Connection,
    run: Any,
    handed: list[Any],
    handoff: Handoff,
    state: dict[str, Any],
    now: float,
) -> list[EventDraft]:
    """Mark freshly enqueued stages running for the worker they are handed to (their
    ``stage.started`` goes out in the same transaction as the completion that freed them)."""
    lc = _lc(run)
    ids = sorted(j.stage_id for j in handed)
    started = _attempt_started(1, now)
    params = {"k_run_id": run.id, "k_ids": ids} | {f"v_{k}": v for k, v in started.items()}
    defer(conn, _start_stages(tuple(started)), params)
    outputs = {sid: r.output for sid, r in state.items() if r.has_output}
    step_rows: list[Any] = []
    if any(state[sid].has_steps for sid in ids):  # a ledger kept by a redrive
        step_rows = list(
            conn.execute(
                sa.select(steps).where(steps.c.run_id == run.id, steps.c.stage_id.in_(ids))
            ).all()
        )
    for job in sorted(handed, key=lambda j: j.stage_id):
        begin = Begin(
            run_id=run.id,
            workflow_id=run.workflow_id,
            version=run.version,
            stage_id=job.stage_id,
            attempt=1,
            input=run.input,
            outputs=outputs,
            steps=[r for r in step_rows if r.stage_id == job.stage_id],
            trace_context=run.trace_context,
        )
        handoff.jobs.append((job, begin))
    return [lc.stage_started(sid, 1) for sid in ids]


@functools.cache
def _jobs_insert(postgres: bool) -> Any:
    """Insert jobs (their rows back); a handed-off job's lease runs from the database clock
    on PostgreSQL, read in the insert itself (no separate ``SELECT clock`` round trip)."""
    stmt = jobs.insert()
    if postgres:
        lease_for = sa.bindparam("lease_for", type_=sa.Float)
        stmt = stmt.values(lease_expires_at=db_clock_sql() + lease_for)
    return stmt.returning(*jobs.c)


@functools.cache
def _start_stages(keys: tuple[str, ...]) -> Any:
    return (
        sa.update(stages)
        .where(
            stages.c.run_id == sa.bindparam("k_run_id"),
            stages.c.stage_id.in_(sa.bindparam("k_ids", expanding=True)),
        )
        .values({k: sa.bindparam(f"v_{k}") for k in keys})
    )


def _attempt_started(attempt: int, now: float) -> dict[str, Any]:
    """A stage row's values when an attempt starts (begun by a worker, or handed to one)."""
    return {
        "status": StageStatus.RUNNING,
        "attempt": attempt,
        "suspensions": 0,
        "started_at": now,
        "error": None,
        "waiting_for": None,
        "wake_at": None,
    }


def _lease_deadline(conn: Connection, lease: float, now: float) -> float:
    """A lease expiry as a number (one value for a multi-row insert)."""
    clock = db_clock(conn, now)
    if not isinstance(clock, float | int):
        clock = conn.execute(sa.select(clock)).scalar_one()
    return float(clock) + lease


@functools.cache
def _staged_query() -> Any:
    """A run's staged business events in release order (stage completion, then emit order)."""
    return (
        sa.select(staged_events, stages.c.completed_order)
        .join(
            stages,
            sa.and_(
                stages.c.run_id == staged_events.c.run_id,
                stages.c.stage_id == staged_events.c.stage_id,
            ),
        )
        .where(staged_events.c.run_id == sa.bindparam("run_id"))
        .order_by(stages.c.completed_order, staged_events.c.idx)
    )


def _finish_completed(
    conn: Connection,
    run: Any,
    graph: GraphModel,
    state: dict[str, Any],
    now: float,
    values: dict[str, Any],
) -> list[EventDraft]:
    lc = _lc(run)
    outputs = {sid: r.output for sid, r in state.items() if r.has_output}
    rows = conn.execute(_staged_query(), {"run_id": run.id}).all()
    drafts = [lc.business(r.stage_id, r.idx, r.type, r.data) for r in rows]
    drafts.append(lc.run_completed())
    if rows:
        delete_where(conn, staged_events, run_id=run.id)
    values.update(
        status=RunStatus.COMPLETED,
        output=run_output(graph.sinks(), outputs),
        finished_at=now,
        updated_at=now,
        current_group=len(graph.groups),
    )
    return drafts


def begin_attempt(
    conn: Connection, job: Any, worker: str, now: float
) -> tuple[Begin | None, list[EventDraft]]:
    """Mark the stage running (emitting run.started / stage.started when they are new)."""
    run = try_run(conn, job.run_id)
    stage = None if run is None else _owned_stage(conn, job, worker)
    if run is None or stage is None:
        return None, []
    lc = _lc(run)
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
        drafts.append(lc.run_started())
    if stage.status == StageStatus.PENDING:
        attempt = job.attempt
        _set_stage(conn, run.id, stage.stage_id, **_attempt_started(attempt, now))
        drafts.append(lc.stage_started(stage.stage_id, attempt))
    elif stage.status in (StageStatus.RUNNING, StageStatus.SUSPENDED):
        attempt = stage.attempt  # resuming (after a sleep, a signal, a poll or a crash)
        _set_stage(conn, run.id, stage.stage_id, status=StageStatus.RUNNING, waiting_for=None)
    else:
        delete_where(conn, jobs, id=job.id)
        return None, []
    run_values = {} if run.status == RunStatus.RUNNING else {"status": RunStatus.RUNNING}
    append_events(conn, run, drafts, now, **run_values)
    state = _load_state(conn, run.id)
    step_rows: list[Any] = []
    if state[stage.stage_id].has_steps:
        step_rows = list(select_where(conn, steps, run_id=run.id, stage_id=stage.stage_id).all())
    begin = Begin(
        run_id=run.id,
        workflow_id=run.workflow_id,
        version=run.version,
        stage_id=stage.stage_id,
        attempt=attempt,
        input=run.input,
        outputs={sid: r.output for sid, r in state.items() if r.has_output},
        steps=step_rows,
        trace_context=run.trace_context,
    )
    return begin, drafts


def abandon_job(conn: Connection, job: Any, worker: str, available_at: float) -> bool:
    """Give back ``worker``'s lease on ``job`` at once, the job due again at ``available_at``
    with its attempt kept (an attempt abandoned on a storage fault). False if the lease is no
    longer ``worker``'s (the outcome was recorded after all, or another worker took over)."""
    res = conn.execute(
        sa.update(jobs)
        .where(
            jobs.c.id == job.id,
            jobs.c.run_id == job.run_id,
            jobs.c.kind == job.kind,
            jobs.c.lease_owner == worker,
            jobs.c.status == "leased",
        )
        .values(status="ready", available_at=available_at, lease_owner=None, lease_expires_at=None)
    )
    return bool(res.rowcount)


def _cancel_stage(conn: Connection, run: Any, stage: Any, now: float) -> list[EventDraft]:
    if stage is None or stage.status not in (
        StageStatus.RUNNING,
        StageStatus.SUSPENDED,
        StageStatus.PENDING,
    ):
        return []
    if stage.status == StageStatus.PENDING and stage.attempt == 0:
        return []  # never started: it ends skipped, with no event
    _set_stage(
        conn,
        run.id,
        stage.stage_id,
        status=StageStatus.CANCELLED,
        finished_at=now,
        waiting_for=None,
        wake_at=None,
    )
    return [_lc(run).stage_cancelled(stage.stage_id)]


def _complete_stage(
    conn: Connection,
    run: Any,
    stage: Any,
    job: Any,
    outcome: Completed,
    now: float,
    run_values: dict[str, Any],
) -> EventDraft:
    """Record a returned stage body: its output and its place in completion order."""
    order = run.completed_count + 1
    values = {
        "status": StageStatus.COMPLETED,
        "output": outcome.output,
        "has_output": True,
        "finished_at": now,
        "completed_order": order,
        "waiting_for": None,
        "wake_at": None,
    }
    # (both writes go out with the transaction's next statement on PostgreSQL)
    update_later(conn, stages, {"run_id": run.id, "stage_id": stage.stage_id}, values)
    run_values.update(completed_count=order, updated_at=now)
    delete_later(conn, jobs, id=job.id)
    return _lc(run).stage_completed(stage.stage_id, stage.attempt)


def apply_outcome(  # noqa: PLR0912, PLR0915  helper `wide` is splitting it (big-graph rewrite)
    conn: Connection,
    job: Any,
    worker: str,
    outcome: Outcome,
    graph: GraphModel,
    now: float,
    cancelled: bool = False,
    handoff: Handoff | None = None,
) -> str:
    """Record one stage attempt's outcome; returns what happened (for host stats)."""
    if handoff is not None:
        handoff.jobs.clear()  # a re-run of this transaction (after a lost connection) hands
        # off only what its own try enqueued
    run = try_run(conn, job.run_id)
    stage = None if run is None else _owned_stage(conn, job, worker)
    if run is None or stage is None:
        return "discarded"  # our lease was lost: another worker owns this stage now
    lc = _lc(run)
    drafts: list[EventDraft] = []
    run_values: dict[str, Any] = {}
    refresh = True
    result = "cancelled"
    stopping = run.status not in ACTIVE or run.cancel_requested
    failing = run.status == RunStatus.COMPENSATING and not run.cancel_requested
    if failing and isinstance(outcome, Completed):
        # a sibling failed for good while this body ran, and it returned before it observed
        # that: its side effect happened, so the stage is completed and the compensation job
        # (which waits for leased stages) undoes it first. After a cancel a late result is
        # discarded instead (SCENARIOS S10): the stage ends cancelled.
        result = "completed"
        drafts.append(_complete_stage(conn, run, stage, job, outcome, now, run_values))
        refresh = False
    elif cancelled or stopping:
        drafts += _cancel_stage(conn, run, stage, now)
        delete_where(conn, jobs, id=job.id)
    elif isinstance(outcome, Completed):
        result = "completed"
        drafts.append(_complete_stage(conn, run, stage, job, outcome, now, run_values))
        # a stage completes once per redrive cycle, and redrive clears what it re-runs, so no
        # staged events of this stage exist yet
        if outcome.events:
            conn.execute(
                staged_events.insert(),
                [
                    {
                        "run_id": run.id,
                        "stage_id": stage.stage_id,
                        "idx": i,
                        "type": e.type,
                        "data": e.data,
                    }
                    for i, e in enumerate(outcome.events)
                ],
            )
        progressed = schedule(conn, run, graph, now, handoff, run_values)
        drafts += progressed
        # the run moved on (finished, or handed its next stages to this worker): its status
        # is already right, so skip recomputing it
        refresh = not progressed
    elif isinstance(outcome, Abandoned):
        # the engine's storage failed during the attempt (DESIGN §5): as after a crash, the
        # stage stays running with its attempt number, no event, and the job is due again
        # after a backoff (not at lease expiry)
        result = "abandoned"
        abandon_job(conn, job, worker, now + ABANDON_BACKOFF_S)
    elif isinstance(outcome, Suspended):
        result = "suspended"
        n = stage.suspensions + 1
        until = None if outcome.until is None else outcome.until.timestamp()
        _set_stage(
            conn,
            run.id,
            stage.stage_id,
            status=StageStatus.SUSPENDED,
            suspensions=n,
            waiting_for=outcome.waiting_for,
            wake_at=until,
        )
        drafts.append(
            lc.stage_suspended(
                stage.stage_id,
                stage.attempt,
                n,
                outcome.reason,
                outcome.until,
                outcome.waiting_for,
            )
        )
        ready_now = False
        if outcome.reason == "signal":
            name = outcome.waiting_for.split(":", 1)[1]
            ready_now = (
                conn.execute(
                    sa.select(signals.c.name).where(
                        signals.c.run_id == run.id,
                        signals.c.name == name,
                        signals.c.consumed.is_(False),
                    )
                ).first()
                is not None
            )
        if ready_now:
            notify_due(conn)
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == job.id)
            .values(
                status="ready" if ready_now else "waiting",
                available_at=now if ready_now else until,
                waiting_for=outcome.waiting_for,
                lease_owner=None,
                lease_expires_at=None,
            )
        )
    else:
        assert isinstance(outcome, Failed)
        spec = graph.stage(stage.stage_id)
        will_retry = outcome.retryable and stage.attempt < spec.retry.max_attempts
        drafts.append(lc.stage_failed(stage.stage_id, stage.attempt, outcome.error, will_retry))
        if will_retry:
            result = "retrying"
            delay = spec.retry.delay_s(stage.attempt)
            _set_stage(
                conn,
                run.id,
                stage.stage_id,
                status=StageStatus.PENDING,
                error=outcome.error.model_dump(),
            )
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == job.id)
                .values(
                    status="ready",
                    available_at=now + delay,
                    attempt=stage.attempt + 1,
                    lease_owner=None,
                    lease_expires_at=None,
                    waiting_for=None,
                )
            )
        else:
            result = "failed"
            _set_stage(
                conn,
                run.id,
                stage.stage_id,
                status=StageStatus.FAILED,
                error=outcome.error.model_dump(),
                finished_at=now,
            )
            delete_where(conn, jobs, id=job.id)
            _touch(conn, run.id, now, error=outcome.error.model_dump())
            append_events(conn, run, drafts, now)
            drafts = begin_compensation(conn, try_run(conn, run.id, lock=False), now)
    append_events(conn, run, drafts, now, **run_values)
    if refresh:
        refresh_status(conn, run.id, now)
    return result


def begin_compensation(conn: Connection, run: Any, now: float) -> list[EventDraft]:
    """Stop the run's other stages and enqueue its compensation job."""
    drafts: list[EventDraft] = []
    others = conn.execute(
        sa.select(jobs).where(jobs.c.run_id == run.id, jobs.c.kind == "stage")
    ).all()
    for j in others:
        if j.status == "leased":
            continue  # its worker sees the run compensating and cancels the stage
        drafts += _cancel_stage(conn, run, _stage(conn, run.id, j.stage_id), now)
        conn.execute(sa.delete(jobs).where(jobs.c.id == j.id))
    _touch(conn, run.id, now, status=RunStatus.COMPENSATING)
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


def begin_compensation_job(
    conn: Connection, job: Any, worker: str, graph: GraphModel, now: float
) -> CompensationPlan | None:
    """The stages to compensate, newest first; None (rescheduled) while stages still run."""
    run = try_run(conn, job.run_id)
    if run is None or not _owns(conn, job, worker):
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
                status="ready", available_at=now + 0.05, lease_owner=None, lease_expires_at=None
            )
        )
        return None
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
    conn: Connection, run_id: str, stage_id: str, error: ErrorInfo | None, now: float
) -> None:
    run = try_run(conn, run_id)
    if run is None:
        return
    if error is None:
        _set_stage(conn, run_id, stage_id, status=StageStatus.COMPENSATED)
        append_events(conn, run, [_lc(run).stage_compensated(stage_id)], now)
    else:
        _set_stage(conn, run_id, stage_id, compensation_error=error.model_dump())
        errors = list(run.compensation_errors or [])
        errors.append(error.model_dump())
        _touch(conn, run_id, now, compensation_errors=errors)


def finish_compensation(conn: Connection, job: Any, worker: str, now: float) -> None:
    run = try_run(conn, job.run_id)
    if run is None or not _owns(conn, job, worker):
        return
    lc = _lc(run)
    conn.execute(
        sa.update(stages)
        .where(stages.c.run_id == run.id, stages.c.status == StageStatus.PENDING)
        .values(status=StageStatus.SKIPPED)
    )
    conn.execute(sa.delete(staged_events).where(staged_events.c.run_id == run.id))
    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run.id))
    if run.cancel_requested:
        status, draft = RunStatus.CANCELLED, lc.run_cancelled()
    else:
        error = (
            ErrorInfo.model_validate(run.error)
            if run.error
            else ErrorInfo(type="EngineError", message="run failed")
        )
        status, draft = RunStatus.FAILED, lc.run_failed(error)
    _touch(conn, run.id, now, status=status, finished_at=now)
    append_events(conn, run, [draft], now)
