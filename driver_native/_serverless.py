"""Serverless entry points: drive the native kernel from a FaaS host, one call per invocation.

A function-as-a-service host (AWS Lambda, Cloud Run jobs, Cloudflare-style queue consumers, a
cron container) has no long-lived process to run :class:`WorkerHost` in. Each invocation calls
one of these (the seed's serverless host, in Python naming; results are pydantic models whose
``model_dump(by_alias=True)`` gives the seed's camelCase keys):

- :func:`handle_job` (seed ``handleJob``) -- execute one job named by a queue message
  (:class:`JobMessage`, see :func:`job_message`) or one job already claimed with
  ``ClaimPending``; returns a :class:`HandleJobResult` the consumer acks or retries on.
- :func:`process_available_jobs` (``processAvailableJobs``) -- claim and run up to
  ``max_jobs`` (default 1) due jobs: ``{processed, succeeded, failed}``.
- :func:`run_maintenance_tick` (``runMaintenanceTick``) -- one round of housekeeping, bounded
  by the host settings: wake due suspended stages, release stale leases, flush the outbox,
  repair stuck runs, apply ``retention``.
- :func:`run_to_completion` (``runToCompletion``) -- create a run (idempotently) from a
  :class:`CreateRun` command and drive it as far as it goes in this call, never waiting.

Every entry point is bounded, keeps no state between calls and leaves the database consistent
when the invocation is frozen or killed: a job whose function died keeps its lease until the
lease threshold passes, then ``run_maintenance_tick`` (or any worker) releases it and another
invocation takes it over with the same attempt number. Heartbeats run while a stage executes,
exactly as in the long-running worker.

The database is the queue: a message only names a job that is already a row. Acknowledging a
message therefore never loses work -- a due job is found again by ``process_available_jobs``
or a worker -- and re-delivering one never runs a job twice (it is leased first).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy import Connection

from engine_port import FlushResult
from engine_port.driver import (
    TERMINAL_RUN_STATUSES,
    check_new_run_id,
    check_numbers,
    check_start_call,
    version_key,
)
from engine_port.errors import InvalidInputError, RunNotActiveError

from ._commands import (
    CreateRun,
    ExecuteJob,
    FlushOutbox,
    PurgeRuns,
    ReapStaleLeases,
    ReapStuckRuns,
)
from ._host_models import (
    HandleJobResult,
    JobMessage,
    JobMessageError,
    MaintenanceTickResult,
    ProcessJobsResult,
    RunToCompletionResult,
)
from ._jobs import lease_values
from ._kernel import Kernel
from ._schema import jobs, runs
from ._sql import lease_until

__all__ = [
    "handle_job",
    "job_message",
    "parse_job_message",
    "process_available_jobs",
    "resolve_job_message",
    "run_maintenance_tick",
    "run_to_completion",
]

log = logging.getLogger("wfe.serverless")

_TERMINAL = TERMINAL_RUN_STATUSES
OUTBOX_FLUSH_TIMEOUT_S = 10.0
"""Seed ``outboxFlushTimeoutMs``: the bound on the flush after a job."""
# the largest job id each database can hold (``wfe_jobs.id``: INTEGER on PostgreSQL, a 64-bit
# rowid on SQLite): a message naming a larger one names no job, and reading it raised the
# driver's overflow error (OverflowError, psycopg's NumericValueOutOfRange) to the consumer
_MAX_JOB_ID_PG, _MAX_JOB_ID_SQLITE = 2_147_483_647, 9_223_372_036_854_775_807


def _default_worker_id() -> str:
    return f"faas:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


# -- transaction bodies ------------------------------------------------------------------------
def _lease(
    conn: Connection,
    worker: str,
    served: Collection[str] | None,
    lease: float,
    now: float,
    *,
    run_id: str | None = None,
    job_id: int | None = None,
    limit: int = 1,
) -> list[Any]:
    """Lease due jobs of one run (or one job by id), like ``ClaimPending`` does for any run."""
    cond = [
        jobs.c.status.in_(("ready", "waiting")),
        jobs.c.available_at.is_not(None),
        jobs.c.available_at <= now,
    ]
    if served is not None:
        cond.append(jobs.c.wfv.in_(list(served)))
    if run_id is not None:
        cond.append(jobs.c.run_id == run_id)
    if job_id is not None:
        cond.append(jobs.c.id == job_id)
    inner = sa.select(jobs.c.id).where(*cond).order_by(jobs.c.available_at).limit(limit)
    if conn.dialect.name == "postgresql":
        inner = inner.with_for_update(skip_locked=True)
    stmt = (
        sa.update(jobs)
        .where(jobs.c.id.in_(inner.scalar_subquery()))
        .values(lease_values(worker, lease_until(conn, lease, now)))
        .returning(*jobs.c)
    )
    return list(conn.execute(stmt).all())


def _job_row(conn: Connection, job_id: int) -> Any:
    return conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).first()


def _after(conn: Connection, job: Any, now: float) -> tuple[Any, list[int]]:
    """The job's row after execution (None when it is gone) and the run's due job ids."""
    run_id = str(job.run_id)
    ready = conn.execute(
        sa.select(jobs.c.id)
        .where(
            jobs.c.run_id == run_id,
            jobs.c.status.in_(("ready", "waiting")),
            jobs.c.available_at.is_not(None),
            jobs.c.available_at <= now,
        )
        .order_by(jobs.c.id)
    ).scalars()
    row = _job_row(conn, int(job.id))
    if row is not None and (row.run_id, row.stage_id, row.kind) != (
        job.run_id,
        job.stage_id,
        job.kind,
    ):
        row = None  # the id was reused (SQLite) by a job created after ours finished
    return row, [int(i) for i in ready]


def _run_state(conn: Connection, run_id: str) -> tuple[Any, list[Any]]:
    run = conn.execute(
        sa.select(runs.c.id, runs.c.status, runs.c.workflow_id, runs.c.version).where(
            runs.c.id == run_id
        )
    ).first()
    own = list(conn.execute(sa.select(jobs).where(jobs.c.run_id == run_id)).all())
    return run, own


def _moved(conn: Connection, run_id: str) -> Any:
    """The run's status and where it went (``migrated_to``), read without its values."""
    return conn.execute(
        sa.select(runs.c.status, runs.c.migrated_to).where(runs.c.id == run_id)
    ).first()


def _wake_suspended(conn: Connection, now: float, limit: int) -> int:
    """Up to ``limit`` suspended stages whose wake time has come become ready (the bounded
    ``stage.pollSuspended`` of one tick; the rest wait for the next tick)."""
    due = (
        sa.select(jobs.c.id)
        .where(jobs.c.status == "waiting", jobs.c.available_at <= now)
        .order_by(jobs.c.available_at)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    res = conn.execute(
        sa.update(jobs)
        .where(jobs.c.id.in_(due.scalar_subquery()), jobs.c.status == "waiting")
        .values(status="ready")
    )
    return res.rowcount or 0


# -- messages ----------------------------------------------------------------------------------
def job_message(job: Any) -> JobMessage:
    """The queue message for a job row (``ClaimPending`` results, or ``ready_job_ids`` read
    back): what a producer puts on a push queue for :func:`handle_job`."""
    wf_id = str(job.wfv).split("@", 1)[0]
    return JobMessage(
        job_id=int(job.id),
        workflow_run_id=str(job.run_id),
        workflow_id=wf_id,
        stage_id=str(job.stage_id),
        attempt=int(job.attempt),
    )


def parse_job_message(message: Any) -> JobMessage:
    """A :class:`JobMessage` from a dict in either spelling (``jobId`` or ``job_id``), a
    JSON string or bytes; raises :class:`JobMessageError` for anything else."""
    if isinstance(message, JobMessage):
        return message
    try:
        if isinstance(message, str | bytes | bytearray):
            return JobMessage.model_validate_json(message)
        if isinstance(message, Mapping):
            return JobMessage.model_validate(dict(message))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()
        )
        raise JobMessageError(message, problems) from None
    raise JobMessageError(message, f"a {type(message).__name__}, not a mapping")


async def resolve_job_message(kernel: Kernel, message: Any) -> tuple[JobMessage, Any]:
    """Parse ``message`` and read the job it names: ``(message, job row or None)``. The row is
    None when the job no longer exists (done, or its run was purged). Raises
    :class:`JobMessageError` when the message is malformed or contradicts the row (a stale
    message whose id now names another job)."""
    msg = parse_job_message(message)
    if msg.job_id > (_MAX_JOB_ID_PG if kernel.db.is_postgres else _MAX_JOB_ID_SQLITE):
        return msg, None  # no job can have that id
    row = await kernel.db.read(_job_row, msg.job_id)
    if row is None:
        return msg, None
    expected = {
        "workflowRunId": (msg.workflow_run_id, str(row.run_id)),
        "workflowId": (msg.workflow_id, str(row.wfv).split("@", 1)[0]),
        "stageId": (msg.stage_id, str(row.stage_id)),
    }
    for name, (given, actual) in expected.items():
        if given is not None and given != actual:
            problem = f"{name} is {given!r:.120} but job {msg.job_id} has {actual!r:.120}"
            raise JobMessageError(message, problem, mismatch=True)
    return msg, row


# -- outcomes ----------------------------------------------------------------------------------
def _delay_ms(available_at: float | None, now: float) -> int | None:
    if available_at is None:
        return None
    return max(0, round((available_at - now) * 1000))


def _max_attempts(kernel: Kernel, job: Any) -> int | None:
    wf_id, _, version = str(job.wfv).partition("@")
    if job.kind != "stage" or not kernel.registry.has(wf_id, version):
        return None
    try:
        return int(
            kernel.registry.get(wf_id, version).get_stage(str(job.stage_id)).retry.max_attempts
        )
    except Exception:  # a stage the definition no longer has
        return None


_SEED_OUTCOME = {
    "completed": "completed",
    "compensated": "completed",
    "skipped": "completed",
    "suspended": "suspended",
}
# failed, but the job is due again: the consumer re-delivers the message after the delay
_RETRY = {"retrying", "deferred", "abandoned", "busy", "not_due"}
# already failed and acknowledged, never retry (the seed's ``dead``)
_DEAD = {"discarded", "cancelled", "gone", "not_served", "malformed", "mismatch", "frozen"}
_ERRORS = {
    "retrying": "the stage failed; another attempt is scheduled",
    "failed": "the stage failed for good; the run compensates",
    "deferred": "compensation waits for running stages",
    "abandoned": "the engine's storage failed during the attempt; it runs again",
    "busy": "the job is leased by another worker",
    "not_due": "the job is not due yet",
    "discarded": "the lease was lost: another worker took the job over",
    "cancelled": "the run was cancelled",
    "gone": "the job no longer exists (done, or its run was purged)",
    "not_served": "this build does not serve the run's workflow version",
    "frozen": "the run is being moved to another driver; if the move is aborted, "
    "process_available_jobs or a worker runs the job",
}


def _result(
    kernel: Kernel,
    job: Any,
    detail: str,
    after: Any,
    ready: list[int],
    now: float,
    error: str | None = None,
) -> HandleJobResult:
    delay = None
    if detail in _RETRY and after is not None and after.status in ("ready", "waiting", "leased"):
        at = after.lease_expires_at if after.status == "leased" else after.available_at
        delay = _delay_ms(at, now)
    elif detail == "suspended" and after is not None and after.status == "waiting":
        delay = _delay_ms(after.available_at, now)  # when the stage wakes (None: a signal)
    attempt = None if job is None else int(job.attempt)  # the attempt that ran (or is next)
    return HandleJobResult(
        outcome=_SEED_OUTCOME.get(detail, "failed"),
        error=error or _ERRORS.get(detail),
        dead=detail in _DEAD,
        will_retry=detail in _RETRY,
        attempt=attempt,
        max_attempts=None if job is None else _max_attempts(kernel, job),
        retry_delay_ms=delay,
        detail=detail,
        job_id=None if job is None else int(job.id),
        workflow_run_id=None if job is None else str(job.run_id),
        stage_id=None if job is None else str(job.stage_id),
        kind=None if job is None else str(job.kind),
        ready_job_ids=ready,
    )


async def _execute(kernel: Kernel, job: Any, worker_id: str) -> HandleJobResult:
    detail = str(await kernel.dispatch(ExecuteJob(job, worker_id)))
    now = kernel.now()
    after, ready = await kernel.db.tx(_after, job, now)
    return _result(kernel, job, detail, after, ready, now)


async def _flush(kernel: Kernel, limit: int, timeout: float) -> FlushResult | None:
    """Publish pending events, bounded by ``timeout``; errors are logged, never raised."""
    try:
        result: FlushResult = await asyncio.wait_for(
            kernel.dispatch(FlushOutbox(limit=limit)), timeout
        )
    except Exception:
        log.warning("serverless: outbox flush failed; the next flush retries", exc_info=True)
        return None
    return result


def _served(kernel: Kernel) -> frozenset[str] | None:
    return None if kernel.settings.serves == "all" else kernel.served()


# -- entry points ------------------------------------------------------------------------------
async def handle_job(
    kernel: Kernel,
    message: Any,
    *,
    worker_id: str | None = None,
    flush_outbox_after_job: bool = True,
    outbox_flush_timeout: float = OUTBOX_FLUSH_TIMEOUT_S,
) -> HandleJobResult:
    """Execute one job and say what the queue consumer does with its message (seed
    ``handleJob``; see :class:`HandleJobResult` for the ack / retry / dead decision).

    ``message`` is a job message (:class:`JobMessage`, a dict in the seed's or Python's
    spelling, or its JSON) -- the job is leased here first -- or a job row returned by
    ``kernel.dispatch(ClaimPending(...))`` (executed under the lease it already holds).
    A malformed message, a job that no longer exists, a message that names another job than
    the row, a version this build does not serve: ``dead`` (ack, never retry). A job leased
    elsewhere or not due yet: ``will_retry`` with the delay until its lease ends or it is due.
    With ``flush_outbox_after_job`` (default) the events the job wrote are published before
    returning (bounded by ``outbox_flush_timeout`` seconds; a failing sink never fails this
    call). Errors of the engine itself (database unreachable) propagate, so the platform
    retries the invocation.
    """
    check_numbers({"outbox_flush_timeout": (outbox_flush_timeout, False, 0.001)})
    worker = worker_id or _default_worker_id()
    await kernel.check_definitions()  # (a structure changed under its version: nothing leased)
    if hasattr(message, "run_id") and hasattr(message, "lease_owner"):
        result = await _execute(kernel, message, worker_id or str(message.lease_owner))
    else:
        result = await _handle_message(kernel, message, worker)
    if flush_outbox_after_job and result.detail not in _DEAD | {"busy", "not_due"}:
        await _flush(kernel, kernel.settings.max_outbox_flush_per_tick, outbox_flush_timeout)
    return result


async def _handle_message(kernel: Kernel, message: Any, worker: str) -> HandleJobResult:
    now = kernel.now()
    try:
        msg, row = await resolve_job_message(kernel, message)
    except JobMessageError as exc:
        log.warning("serverless: %s", exc)
        detail = "mismatch" if exc.mismatch else "malformed"
        return _result(kernel, None, detail, None, [], now, error=str(exc))
    if row is None:
        gone = HandleJobResult(
            outcome="failed",
            error=_ERRORS["gone"],
            dead=True,
            detail="gone",
            job_id=msg.job_id,
            workflow_run_id=msg.workflow_run_id,
            stage_id=msg.stage_id,
            attempt=msg.attempt,
        )
        return gone
    served = _served(kernel)
    if served is not None and str(row.wfv) not in served:
        return _result(kernel, row, "not_served", row, [], now)
    leased = await kernel.db.tx(
        _lease, worker, served, kernel.settings.lease_threshold, now, job_id=msg.job_id
    )
    if not leased:
        row = await kernel.db.read(_job_row, msg.job_id)
        if row is None:
            return _result(kernel, None, "gone", None, [], now)
        if row.status == "waiting" and row.available_at is None:
            # parked on a signal (a re-delivery of the message that suspended it): no time to
            # retry at -- it was will_retry with no delay, re-delivered at once until the
            # signal came. Acknowledged: the signal makes the job due, and it is found again
            # by process_available_jobs or a worker (the database is the queue)
            return _result(kernel, row, "suspended", row, [], now)
        if row.status == "frozen":  # (was not_due with no delay: re-delivered at once, for
            # as long as the move took, or for ever after an interrupted one)
            return _result(kernel, row, "frozen", row, [], now)
        return _result(kernel, row, "busy" if row.status == "leased" else "not_due", row, [], now)
    return await _execute(kernel, leased[0], worker)


async def process_available_jobs(
    kernel: Kernel,
    max_jobs: int = 1,
    *,
    worker_id: str | None = None,
    flush_outbox_after_job: bool = True,
    outbox_flush_timeout: float = OUTBOX_FLUSH_TIMEOUT_S,
) -> ProcessJobsResult:
    """Claim and execute up to ``max_jobs`` (default 1, the seed's advice for functions with
    a strict CPU limit) due jobs, one at a time; stops early when none is due. Returns
    ``{processed, succeeded, failed}`` (succeeded: completed or suspended) and each result.

    A job that fails inside the engine counts as failed; its lease expires and another
    invocation takes it over.
    """
    check_numbers(
        {
            "max_jobs": (max_jobs, True, 1),
            "outbox_flush_timeout": (outbox_flush_timeout, False, 0.001),
        }
    )
    worker = worker_id or _default_worker_id()
    results: list[HandleJobResult] = []
    served = _served(kernel)
    await kernel.check_definitions()  # (a structure changed under its version: none claimed)
    # a warm host: attempts an earlier invocation abandoned while the database was away, whose
    # leases could not be given back then, are due again now (not at the lease's expiry)
    await kernel.return_leases()
    while len(results) < max_jobs:
        claimed = await kernel.db.tx(
            _lease, worker, served, kernel.settings.lease_threshold, kernel.now()
        )
        if not claimed:
            break
        job = claimed[0]
        try:
            results.append(await _execute(kernel, job, worker))
        except Exception as exc:
            log.exception("serverless: job %s of run %s failed in the engine", job.id, job.run_id)
            r = _result(kernel, job, "abandoned", None, [], kernel.now())
            results.append(r.model_copy(update={"error": f"{type(exc).__name__}: {exc}"}))
    if flush_outbox_after_job and results:
        await _flush(kernel, kernel.settings.max_outbox_flush_per_tick, outbox_flush_timeout)
    ok = sum(r.outcome != "failed" for r in results)
    return ProcessJobsResult(
        processed=len(results), succeeded=ok, failed=len(results) - ok, results=results
    )


async def run_maintenance_tick(
    kernel: Kernel,
    *,
    stuck_grace_seconds: float = 60.0,
    retention: float | None = None,
) -> MaintenanceTickResult:
    """One round of housekeeping (seed ``runMaintenanceTick``); schedule it every minute or
    so. Wakes up to ``max_suspended_checks_per_tick`` due suspended stages, releases the
    leases of dead workers, flushes up to ``max_outbox_flush_per_tick`` events, repairs stuck
    runs and, with ``retention`` (seconds; default the ``retention`` setting), purges finished
    runs older than that. Does not execute jobs: that is ``process_available_jobs``."""
    check_numbers({"stuck_grace_seconds": (stuck_grace_seconds, False, 0)})
    if retention is not None:
        check_numbers({"retention": (retention, False, 0)})
    s = kernel.settings
    woken = int(await kernel.db.tx(_wake_suspended, kernel.now(), s.max_suspended_checks_per_tick))
    released = int(await kernel.dispatch(ReapStaleLeases()))
    flush = await kernel.dispatch(FlushOutbox(limit=s.max_outbox_flush_per_tick))
    stuck = int(await kernel.dispatch(ReapStuckRuns(stuck_grace_seconds)))
    keep = retention if retention is not None else s.retention
    purged = int(await kernel.dispatch(PurgeRuns(keep))) if keep is not None else 0
    result = MaintenanceTickResult(
        suspended_checked=woken,
        stale_released=released,
        events_flushed=flush.published,
        stuck_reaped=stuck,
        purged=purged,
        events_failed=flush.failed,
        events_dead_lettered=flush.dead_lettered,
        event_sink_status=flush.sink_status,
        event_sink_error=flush.sink_error,
    )
    level = logging.WARNING if flush.degraded else logging.INFO
    log.log(level, "serverless: maintenance tick %s", result.model_dump(by_alias=True))
    return result


async def _run_info(kernel: Kernel, run_id: str) -> Any:
    from ._engine import NativeEngine

    view = NativeEngine(kernel.settings, kernel.registry, clock=kernel.clock)
    view._kernel = kernel  # a read-only view over this kernel; never connected or closed
    return await view.get_run(run_id)


async def run_to_completion(
    kernel: Kernel,
    command: CreateRun,
    *,
    worker_id: str | None = None,
    max_jobs: int = 50,
    max_claim_rounds: int = 5,
    claims_per_round: int = 1,
    flush_outbox: bool = True,
    max_outbox_flush: int | None = None,
) -> RunToCompletionResult:
    """Create the run ``command`` describes (idempotently: give it an ``idempotency_key`` and
    a repeat drives the same run) and drive it as far as it goes in this call (seed
    ``runToCompletion``). Never waits, never does maintenance, never raises for a run that
    does not finish:

    - ``completed``, ``failed``, ``cancelled``: the run is terminal (``output``, ``reason``);
    - ``suspended``: a stage parked on a durable sleep or a signal (``suspended_stage_id``);
      a worker or ``run_maintenance_tick`` + ``process_available_jobs`` resumes it;
    - ``incomplete`` with a ``reason``: ``max_jobs`` executed, a retry backoff not due yet,
      the run's job leased elsewhere for ``max_claim_rounds`` rounds, a version not served.

    A repeat of the key of a run that was moved to another engine raises RunNotActiveError
    (``migrated_to`` names where it went), as ``engine.start`` does.

    This run's due jobs are leased first (the database queue can be narrowed to one run,
    unlike the seed's). Only while its next job is held by another worker does a round claim
    up to ``claims_per_round`` other due jobs and run them (``foreign_jobs_processed``).
    """
    _check_create(command)
    check_numbers(
        {
            "max_jobs": (max_jobs, True, 1),
            "max_claim_rounds": (max_claim_rounds, True, 0),
            "claims_per_round": (claims_per_round, True, 1),
        }
    )
    if max_outbox_flush is not None:
        check_numbers({"max_outbox_flush": (max_outbox_flush, True, 1)})
    worker = worker_id or _default_worker_id()
    run_id, created = await kernel.dispatch(command)
    if not created:  # a keyed repeat: a run moved away raises, as engine.start does
        moved = await kernel.db.read(_moved, run_id)
        if moved is not None and moved.status == "migrated":
            raise RunNotActiveError(run_id, moved.status, "start", migrated_to=moved.migrated_to)
    drive = _Drive(
        run_id=run_id,
        worker=worker,
        served=_served(kernel),
        max_jobs=max_jobs,
        max_claim_rounds=max_claim_rounds,
        claims_per_round=claims_per_round,
    )
    await _drive(kernel, drive)
    if flush_outbox:
        limit = max_outbox_flush or kernel.settings.max_outbox_flush_per_tick
        await _flush(kernel, limit, OUTBOX_FLUSH_TIMEOUT_S)
    info = await _run_info(kernel, run_id)
    reason = drive.reason
    if info.error is not None and reason is None and drive.outcome == "failed":
        reason = f"{info.error.type}: {info.error.message}"
    return RunToCompletionResult(
        workflow_run_id=run_id,
        status=str(info.status),
        outcome=drive.outcome,
        output=info.output,
        reason=reason,
        jobs_processed=drive.executed,
        foreign_jobs_processed=drive.foreign,
        suspended_stage_id=drive.suspended_stage,
        created=bool(created),
    )


def _check_create(command: Any) -> None:
    """The command of ``run_to_completion``, checked as ``engine.start`` checks its arguments
    (the kernel trusts its callers): anything else raised a KeyError naming its type, a run
    id that is not a string a TypeError, and a key too long for its column PostgreSQL's
    DataError (SQLite stored it)."""
    if not isinstance(command, CreateRun):
        raise InvalidInputError(
            None,
            f"run_to_completion takes a CreateRun command, not {type(command).__name__}: "
            "pass CreateRun(workflow_id, input, idempotency_key=...)",
            ("command",),
        )
    check_start_call(command.workflow_id, command.idempotency_key, command.version)
    if command.run_id is not None:
        check_new_run_id(command.run_id)


@dataclass(kw_only=True)
class _Drive:
    """One ``run_to_completion`` call: its bounds, and how far it got."""

    run_id: str
    worker: str
    served: frozenset[str] | None
    max_jobs: int
    max_claim_rounds: int
    claims_per_round: int
    executed: int = 0
    foreign: int = 0
    rounds: int = 0
    outcome: str = "incomplete"
    reason: str | None = None
    suspended_stage: str | None = None


async def _drive(kernel: Kernel, drive: _Drive) -> None:
    """Execute the run's due jobs until it ends, parks, or a bound stops the call."""
    while True:
        run, own = await kernel.db.tx(_run_state, drive.run_id)
        if _must_stop(drive, run):
            return
        now = kernel.now()
        leased = await kernel.db.tx(
            _lease,
            drive.worker,
            drive.served,
            kernel.settings.lease_threshold,
            now,
            run_id=drive.run_id,
        )
        if leased:
            await _execute(kernel, leased[0], drive.worker)
            drive.executed += 1
            continue
        if any(j.status == "leased" for j in own):
            if await _run_foreign_jobs(kernel, drive, now):
                continue
            return
        _settle_idle(drive, own, now)
        return


def _must_stop(drive: _Drive, run: Any) -> bool:
    """True (with the outcome and reason set) when the run ended, is not served here, or the
    call executed ``max_jobs``."""
    if run.status in _TERMINAL:
        drive.outcome = str(run.status) if run.status != "migrated" else "incomplete"
        if run.status == "migrated":
            drive.reason = "the run was migrated to another driver"
        return True
    if drive.served is not None and version_key(run.workflow_id, run.version) not in drive.served:
        drive.reason = f"version {run.version!r} of {run.workflow_id!r} is not served here"
        return True
    if drive.executed >= drive.max_jobs:
        drive.reason = f"max_jobs={drive.max_jobs} reached"
        return True
    return False


async def _run_foreign_jobs(kernel: Kernel, drive: _Drive, now: float) -> bool:
    """The run's job is held by another worker: spend one round on other due jobs. False
    (with the reason set) when the call should stop."""
    if drive.rounds >= drive.max_claim_rounds:
        drive.reason = f"max_claim_rounds={drive.max_claim_rounds}: the run's job is held elsewhere"
        return False
    drive.rounds += 1
    others = await kernel.db.tx(
        _lease,
        drive.worker,
        drive.served,
        kernel.settings.lease_threshold,
        now,
        limit=min(drive.claims_per_round, drive.max_jobs - drive.executed),
    )
    for job in others:
        await _execute(kernel, job, drive.worker)
        drive.executed += 1
        drive.foreign += job.run_id != drive.run_id
    if not others:
        drive.reason = "the run's job is executing on another worker"
        return False
    return True


def _settle_idle(drive: _Drive, own: list[Any], now: float) -> None:
    """Nothing of the run is due or leased: it is parked on a wait, backing off before a
    retry, or stuck with no job at all."""
    waiting = [j for j in own if j.status == "waiting"]
    if waiting:
        drive.outcome, drive.suspended_stage = "suspended", str(waiting[0].stage_id)
        return
    later = [j for j in own if j.available_at is not None]
    if later:
        j = min(later, key=lambda j: j.available_at)
        drive.reason = f"stage {j.stage_id!r} is due again in {_delay_ms(j.available_at, now)} ms"
    else:
        drive.reason = "the run has no job to execute; run_maintenance_tick repairs a stuck run"
