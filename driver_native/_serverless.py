"""Serverless entry points: drive the native kernel from a FaaS host, one call per invocation.

A function-as-a-service host (AWS Lambda, Cloud Run jobs, Azure Functions, a cron container)
has no long-lived process to run :class:`WorkerHost` in. Instead each invocation calls one of:

- :func:`handle_job` -- execute one job named by a queue message (``{"job_id": 42}``) or one
  job already claimed with ``ClaimPending``; returns an outcome dict the host can act on (for
  example re-deliver the message after ``retryDelayMs``).
- :func:`process_available_jobs` -- claim and run up to ``max_jobs`` due jobs (a timer-triggered
  function that drains the queue a bit at a time).
- :func:`run_maintenance_tick` -- the worker's housekeeping, once: reap stale leases, wake due
  suspended stages, flush the outbox, reap stuck runs (schedule it every few seconds).
- :func:`run_to_completion` -- drive one run as far as it can go within ``max_jobs`` and
  ``timeout`` (a request handler that wants the result of a short workflow synchronously).

Every entry point is bounded, keeps no state between calls and leaves the database consistent
when the invocation is frozen or killed: a job whose function died keeps its lease until
``lease_seconds`` pass, then ``run_maintenance_tick`` (or any worker) reaps it and another
invocation takes it over with the same attempt number. Heartbeats run while a stage executes,
exactly as in the long-running worker.

Outcome dicts (JSON-serialisable, camelCase for queue payloads)::

    {"jobId": 42, "runId": "...", "stage": "b", "outcome": "completed", "willRetry": False,
     "retryDelayMs": None, "dead": False, "readyJobIds": [43]}

``outcome`` is what the kernel did: ``completed``, ``suspended``, ``retrying``, ``failed``,
``cancelled``, ``compensated`` (a compensation job ran), ``deferred`` (compensation waits for
running stages), ``skipped`` (nothing left to do), ``discarded`` (the lease was lost),
``abandoned`` (the engine's storage failed: the job is due again after a short backoff with
its attempt kept, see ``retryDelayMs``), or, for
``{"job_id": ...}`` messages, ``busy`` (leased elsewhere), ``not_due`` or ``gone``.
``willRetry`` is true when the stage failed and another attempt is scheduled; ``retryDelayMs``
is how long until the job is due again (retry backoff, a sleep's wake-up, a not-yet-due job;
``None`` when no time is set: done, failed, waiting for a signal); ``dead`` is true when the
stage failed for good (the run compensates); ``readyJobIds`` are the run's jobs that are due
now (a queue-driven host enqueues a message for each).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Collection, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port.driver import TERMINAL_RUN_STATUSES

from ._commands import (
    ClaimPending,
    ExecuteJob,
    FlushOutbox,
    PollSuspended,
    PurgeRuns,
    ReapStaleLeases,
    ReapStuckRuns,
)
from ._kernel import Kernel
from ._schema import jobs, runs
from ._sql import lease_until

__all__ = [
    "handle_job",
    "process_available_jobs",
    "run_maintenance_tick",
    "run_to_completion",
]

log = logging.getLogger("wfe.serverless")

_TERMINAL = TERMINAL_RUN_STATUSES


def _default_worker_id() -> str:
    return f"faas:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


# -- transaction bodies ------------------------------------------------------------------------
def _lease(
    conn: Connection,
    worker: str,
    served: Collection[str],
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
        jobs.c.wfv.in_(list(served)),
    ]
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
        .values(status="leased", lease_owner=worker, lease_expires_at=lease_until(conn, lease, now))
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


# -- outcomes ----------------------------------------------------------------------------------
def _delay_ms(available_at: float | None, now: float) -> int | None:
    if available_at is None:
        return None
    return max(0, round((available_at - now) * 1000))


def _outcome(
    job: Any, result: str, after: Any, ready: list[int], now: float, **extra: Any
) -> dict[str, Any]:
    will_retry = result == "retrying"
    delay = None
    if (
        after is not None
        and after.status in ("ready", "waiting")
        and result in ("retrying", "suspended", "deferred", "not_due", "abandoned")
    ):
        delay = _delay_ms(after.available_at, now)
    return {
        "jobId": int(job.id),
        "runId": str(job.run_id),
        "stage": str(job.stage_id),
        "kind": str(job.kind),
        "outcome": result,
        "willRetry": will_retry,
        "retryDelayMs": delay,
        "dead": result == "failed",
        "readyJobIds": ready,
        **extra,
    }


async def _execute(kernel: Kernel, job: Any, worker_id: str) -> dict[str, Any]:
    result = str(await kernel.dispatch(ExecuteJob(job, worker_id)))
    now = kernel.now()
    after, ready = await kernel.db.tx(_after, job, now)
    return _outcome(job, result, after, ready, now)


# -- entry points ------------------------------------------------------------------------------
async def handle_job(
    kernel: Kernel, message: Any, *, worker_id: str | None = None
) -> dict[str, Any]:
    """Execute one job and return its outcome dict (see the module docstring).

    ``message`` is a queue message ``{"job_id": 42}`` (the job is leased here first; a job
    that is leased elsewhere, not due yet or already finished is reported as ``busy``,
    ``not_due`` or ``gone`` without running anything) or a job row returned by
    ``kernel.dispatch(ClaimPending(...))`` (executed under the lease it already holds).
    A fault of the engine's storage during the attempt gives the lease back at once
    (``abandoned``); errors of the engine itself outside it (database unreachable before the
    job is leased) propagate, so the FaaS platform retries the invocation.
    """
    if isinstance(message, Mapping):
        raw = message.get("job_id", message.get("jobId"))
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise ValueError(f"a job message needs an integer 'job_id', got {message!r}")
        job_id = int(raw)
        worker = worker_id or _default_worker_id()
        now = kernel.now()
        leased = await kernel.db.tx(
            _lease, worker, kernel.served(), kernel.settings.lease_seconds, now, job_id=job_id
        )
        if not leased:
            row = await kernel.db.tx(_job_row, job_id)
            if row is None:
                return {
                    "jobId": job_id,
                    "runId": None,
                    "stage": None,
                    "kind": None,
                    "outcome": "gone",
                    "willRetry": False,
                    "retryDelayMs": None,
                    "dead": False,
                    "readyJobIds": [],
                }
            if row.status == "leased":
                result = "busy"
            elif f"{row.wfv}" not in kernel.served():
                result = "not_served"
            else:
                result = "not_due"
            return _outcome(row, result, row, [], now)
        return await _execute(kernel, leased[0], worker)
    if not hasattr(message, "id") or not hasattr(message, "run_id"):
        raise ValueError(
            "handle_job takes {'job_id': N} or a job returned by ClaimPending, "
            f"not {type(message).__name__}"
        )
    return await _execute(kernel, message, worker_id or str(message.lease_owner))


async def process_available_jobs(
    kernel: Kernel, max_jobs: int, worker_id: str | None = None
) -> list[dict[str, Any]]:
    """Claim and execute up to ``max_jobs`` due jobs, one at a time (each claimed just before
    it runs, so no lease waits while another job executes); returns their outcome dicts.

    Stops early when no job is due. A job that fails inside the engine is reported with
    ``outcome="error"``; its lease expires and another invocation takes it over.
    """
    worker = worker_id or _default_worker_id()
    outcomes: list[dict[str, Any]] = []
    while len(outcomes) < max_jobs:
        claimed = await kernel.dispatch(ClaimPending(worker, limit=1))
        if not claimed:
            break
        job = claimed[0]
        try:
            outcomes.append(await _execute(kernel, job, worker))
        except Exception as exc:
            log.exception("serverless: job %s of run %s failed in the engine", job.id, job.run_id)
            outcomes.append(
                {
                    "jobId": int(job.id),
                    "runId": str(job.run_id),
                    "stage": str(job.stage_id),
                    "kind": str(job.kind),
                    "outcome": "error",
                    "willRetry": False,
                    "retryDelayMs": None,
                    "dead": False,
                    "readyJobIds": [],
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
    return outcomes


async def run_maintenance_tick(
    kernel: Kernel,
    *,
    stuck_grace_seconds: float = 60.0,
    retention_seconds: float | None = None,
) -> dict[str, Any]:
    """One round of the worker's housekeeping; returns what it did::

    {"reapedLeases": n, "woken": n, "flush": {"delivered", "failed", "dead", "degraded"},
     "degraded": bool, "reapedRuns": n, "purged": n}
    """
    reaped = int(await kernel.dispatch(ReapStaleLeases()))
    woken = int(await kernel.dispatch(PollSuspended()))
    flush = await kernel.dispatch(FlushOutbox())
    stuck = int(await kernel.dispatch(ReapStuckRuns(stuck_grace_seconds)))
    purged = 0
    if retention_seconds is not None:
        purged = int(await kernel.dispatch(PurgeRuns(retention_seconds)))
    return {
        "reapedLeases": reaped,
        "woken": woken,
        "flush": flush.model_dump(),
        "degraded": bool(flush.degraded),
        "reapedRuns": stuck,
        "purged": purged,
    }


async def _run_info(kernel: Kernel, run_id: str) -> dict[str, Any]:
    from ._engine import NativeEngine

    view = NativeEngine(kernel.settings, kernel.registry, clock=kernel.clock)
    view._kernel = kernel  # a read-only view over this kernel; never connected or closed
    info = await view.get_run(run_id)
    return info.model_dump(mode="json")


async def run_to_completion(
    kernel: Kernel,
    run_id: str,
    *,
    max_jobs: int = 1000,
    timeout: float = 30.0,
    worker_id: str | None = None,
) -> dict[str, Any]:
    """Drive one run as far as it goes within ``max_jobs`` executed jobs and ``timeout``
    seconds; returns ``{"status", "jobs", "foreign_jobs", "run"}``.

    ``status`` is the run's terminal status (``completed``, ``failed``, ``cancelled``,
    ``migrated``); ``suspended`` when the run waits for something that will not happen by
    itself within the time left (a signal, or a sleep / retry / wait deadline beyond the
    timeout); ``incomplete`` when the budget ran out first (or this host does not serve the
    run's version, see ``reason``). ``run`` is the RunInfo as a JSON dict.

    Only this run's jobs are claimed, through the same leases as any worker. While the run
    waits for a near wake-up (a short sleep, a retry backoff), the invocation helps with other
    runs' due jobs instead of idling; those are counted in ``foreign_jobs`` and come out of the
    same ``max_jobs`` budget. The outbox is flushed before returning.
    """
    worker = worker_id or _default_worker_id()
    served = kernel.served()
    deadline = time.monotonic() + timeout
    own_jobs = foreign = 0
    status: str = "incomplete"
    reason: str | None = None
    tick = min(0.05, kernel.settings.poll_interval_seconds)
    while True:
        run, own = await kernel.db.tx(_run_state, run_id)
        if run is None:
            from engine_port.errors import RunNotFoundError

            raise RunNotFoundError(run_id)
        if run.status in _TERMINAL:
            status = str(run.status)
            break
        if f"{run.workflow_id}@{run.version}" not in served:
            reason = f"version {run.version!r} of {run.workflow_id!r} is not served here"
            break
        if own_jobs + foreign >= max_jobs:
            reason = f"max_jobs={max_jobs} reached"
            break
        now = kernel.now()
        leased = await kernel.db.tx(
            _lease, worker, served, kernel.settings.lease_seconds, now, run_id=run_id
        )
        if leased:
            await _execute(kernel, leased[0], worker)
            own_jobs += 1
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            reason = f"timeout={timeout}s reached"
            break
        busy = any(j.status == "leased" for j in own)
        due = [j.available_at for j in own if j.status != "leased" and j.available_at is not None]
        next_due = min(due) if due else None
        if not busy and own and (next_due is None or next_due - now > remaining):
            status = "suspended"  # a signal, or a wake-up beyond the time left
            break
        # The run waits for a near wake-up, another worker's lease or stuck-run repair:
        # run housekeeping, help with one foreign job, or sleep a tick.
        await kernel.dispatch(ReapStaleLeases())
        await kernel.dispatch(PollSuspended())
        await kernel.dispatch(ReapStuckRuns())
        other = await kernel.dispatch(ClaimPending(worker, limit=1))
        if other:
            await _execute(kernel, other[0], worker)
            if other[0].run_id == run_id:
                own_jobs += 1
            else:
                foreign += 1
            continue
        wait = tick if next_due is None else max(0.0, min(next_due - now, tick))
        await kernel.clock.sleep(min(wait, max(remaining, 0.0)))
        await asyncio.sleep(0)
    try:
        await kernel.dispatch(FlushOutbox())
    except Exception:  # the sink is the user's; a failing flush never fails the invocation
        log.exception("serverless: outbox flush failed")
    result: dict[str, Any] = {
        "status": status,
        "jobs": own_jobs,
        "foreign_jobs": foreign,
        "run": await _run_info(kernel, run_id),
    }
    if reason is not None:
        result["reason"] = reason
    return result
