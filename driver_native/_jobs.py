"""The job queue in the database: claim with leases, heartbeat, reap stale leases, wake
suspended stages. On PostgreSQL a claim is one UPDATE over FOR UPDATE SKIP LOCKED, and a
transaction that makes a job due now sends a NOTIFY on :data:`CHANNEL` (with the schema as
payload) so that idle workers of other processes claim it at once instead of at their next
poll (polling stays, as the safety net). A job made due in the future (a sleep, a wait's
timeout, a retry's delay) wakes the worker that recorded it at that time (its own timer,
``WorkerHost._due_at``); an idle worker's look for work (:func:`next_due`, the read it took
anyway) also tells it the earliest due time of every job it would claim, whoever recorded
it (a worker that stopped, another process), and it sets its timer for that one too. A job
another process records in the future after that look is found at the next look (a pass
that finds nothing due, or the poll)."""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port.driver import WORKING_RUN_STATUSES, version_key

from ._rawsql import execute
from ._schema import DUE_PREDICATE, jobs, runs
from ._sql import db_clock, db_clock_sql, in_binds, in_params, lease_until

__all__ = [
    "CHANNEL",
    "Lease",
    "claim",
    "claim_woken",
    "heartbeat",
    "held",
    "lease_values",
    "next_due",
    "notify_ahead",
    "notify_due",
    "poll_suspended",
    "reap_stale",
    "release",
]

CHANNEL = "wfe_jobs_due"
"""The PostgreSQL NOTIFY channel of due jobs; the payload is the schema (``current_schema()``),
so workers of other schemas sharing the database ignore it."""

AHEAD = ":ahead"
"""The suffix of a payload on :data:`CHANNEL` (the schema, then this) that asks idle workers
to look for work again, and so learn the due times to come (``notify_ahead``): no job is due
now. Workers of versions before it ignore it (not their schema)."""


@functools.cache
def _notify_stmt() -> Any:
    return sa.select(sa.func.pg_notify(CHANNEL, sa.func.current_schema()))


def notify_due(conn: Connection) -> None:
    """Tell idle workers of other processes that a job is due now (PostgreSQL; sent when this
    transaction commits, with its last statements: no round trip of its own)."""
    if conn.dialect.name == "postgresql":
        execute(conn, _notify_stmt(), {}, later=True)


@functools.cache
def _ahead_stmt() -> Any:
    return sa.select(sa.func.pg_notify(CHANNEL, sa.func.current_schema() + AHEAD))


def notify_ahead(conn: Connection) -> None:
    """Ask the idle workers of other processes to look again when to wake (PostgreSQL; a
    worker that stops sends it: the jobs it would have woken itself for, a sleep it recorded
    after another worker's last look, come due on time there, not at the poll)."""
    if conn.dialect.name == "postgresql":
        execute(conn, _ahead_stmt(), {})


@functools.cache
def held(postgres: bool) -> Any:
    """``SELECT id FROM jobs``: the job ``:lease_job`` if it is still leased under the claim
    ``:lease_token`` held by ``:lease_worker`` (a claim of the same worker made since, after a
    reap, has another token: its attempt is another). On PostgreSQL the row is locked FOR
    SHARE until the transaction ends: a reap or a claim locks it FOR UPDATE, so one of them
    waits for, or skips, the other, and a lease taken over meanwhile is seen as gone. Used
    inside the statement that writes (or with the run read, in its round trip)."""
    owned = sa.select(jobs.c.id).where(*_held_where())
    return owned.with_for_update(read=True) if postgres else owned


def _held_where() -> list[Any]:
    return [
        jobs.c.id == sa.bindparam("lease_job", type_=sa.Integer),
        jobs.c.status == "leased",
        jobs.c.lease_owner == sa.bindparam("lease_worker", type_=sa.String),
        jobs.c.lease_token == sa.bindparam("lease_token", type_=sa.Integer),
    ]


@dataclass(frozen=True)
class Lease:
    """One claim of a job: the job, the worker holding it, and the claim's token (the job
    row's ``lease_token`` as the claim returned it)."""

    job_id: int
    worker: str
    token: int

    @classmethod
    def of(cls, job: Any, worker: str) -> Lease:
        """The claim ``job`` (a job row as a claim returned it) was leased to ``worker`` by."""
        return cls(int(job.id), worker, int(job.lease_token))

    def params(self) -> dict[str, Any]:
        """The parameters of ``held``."""
        return {"lease_job": self.job_id, "lease_worker": self.worker, "lease_token": self.token}


def claim(
    conn: Connection,
    worker: str,
    served: Collection[str] | None,
    limit: int,
    lease: float,
    now: float,
) -> list[Any]:
    """Lease up to ``limit`` due jobs whose "workflow@version" this host serves."""
    params: dict[str, Any] = {"now": now, "limit": limit, "worker": worker, "lease": lease}
    n = None if served is None else len(served)
    if served is not None:
        params |= in_params(sorted(served), "served")
    stmt = _claim_stmt(conn.dialect.name == "postgresql", n)
    return execute(conn, stmt, params).all()


def _due(served: int | None) -> list[Any]:
    """Due jobs (of the ``served`` "workflow@version"s given as that many parameters)."""
    cond = [
        sa.text(DUE_PREDICATE),  # (in so many words: the partial index ix_wfe_jobs_due)
        jobs.c.available_at <= sa.bindparam("now", type_=sa.Float),
    ]
    if served is not None:
        cond.append(jobs.c.wfv.in_(in_binds(served, "served")) if served else sa.false())
    return cond


def lease_values(worker: Any, until: Any) -> dict[str, Any]:
    """What a claim sets: leased to ``worker`` until ``until``, under a new claim token."""
    return {
        "status": "leased",
        "lease_owner": worker,
        "lease_expires_at": until,
        "lease_token": jobs.c.lease_token + 1,
    }


def _lease_stmt(ids: Any, clock: Any) -> Any:
    """Lease the jobs ``ids`` (a select of job ids) to the bound ``worker`` until ``clock`` +
    ``lease``, returning their rows (with the claim's ``lease_token``)."""
    return (
        sa.update(jobs)
        .where(jobs.c.id.in_(ids.scalar_subquery()))
        .values(lease_values(sa.bindparam("worker"), clock + sa.bindparam("lease", type_=sa.Float)))
        .returning(*jobs.c)
    )


@functools.cache
def _claim_stmt(postgres: bool, served: int | None) -> Any:
    """Built once per shape (per number of served versions)."""
    inner = (
        sa.select(jobs.c.id)
        .where(*_due(served))
        .order_by(jobs.c.available_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    clock: Any = sa.bindparam("now", type_=sa.Float)
    if postgres:
        inner = inner.with_for_update(skip_locked=True)
        clock = sa.func.extract("epoch", sa.func.clock_timestamp())
    return _lease_stmt(inner, clock)


@functools.cache
def _next_due_stmt(served: int | None) -> Any:
    """One row: for each served "workflow@version" (None: all of them at once) and each
    status a claim takes, the earliest ``available_at`` of its claimable jobs (NULL: none).
    Each is the first entry of an index range (``ix_wfe_jobs_due``: wfv, status, available_at;
    ``ix_wfe_jobs_claim`` without a version filter), not a scan of the jobs due later: a
    million sleeping runs cost this look what none do."""

    def first(status: str, wfv: Any) -> Any:
        cond: list[Any] = [
            sa.text(DUE_PREDICATE),
            jobs.c.status == sa.literal_column(f"'{status}'"),
        ]
        if wfv is not None:
            cond.append(jobs.c.wfv == wfv)
        one = sa.select(jobs.c.available_at).where(*cond).order_by(jobs.c.available_at)
        return one.limit(1).scalar_subquery()

    wfvs: list[Any] = [None] if served is None else in_binds(served, "served")
    cols = [first(st, v) for v in wfvs for st in ("ready", "waiting")]
    return sa.select(*(c.label(f"t{i}") for i, c in enumerate(cols)))


def next_due(conn: Connection, served: Collection[str] | None) -> float | None:
    """The earliest time a job a claim (of the ``served`` "workflow@version"s; None: any)
    would take is due, in the past when one is due now; None when there is none (an
    autocommit read: no write lock while idle). A claim finds a job iff this is <= its
    ``now``: the idle worker's look for work, which also tells it when to look again."""
    params: dict[str, Any] = {}
    if served is not None:
        if not served:
            return None
        params |= in_params(sorted(served), "served")
    row = execute(conn, _next_due_stmt(None if served is None else len(served)), params).first()
    times = [] if row is None else [float(t) for t in row if t is not None]
    return min(times, default=None)


def heartbeat(
    conn: Connection, job_id: int, worker: str, lease: float, now: float, token: int | None = None
) -> tuple[bool, bool]:
    """Extend a lease (the claim ``token``'s; None: any claim of ``worker``); returns (still
    ours, the run wants this stage stopped)."""
    mine = [jobs.c.id == job_id, jobs.c.lease_owner == worker, jobs.c.status == "leased"]
    if token is not None:
        mine.append(jobs.c.lease_token == token)
    res = conn.execute(
        sa.update(jobs)
        .where(*mine)
        .values(lease_expires_at=lease_until(conn, lease, now))
        .returning(jobs.c.run_id, jobs.c.kind)
    ).first()
    if res is None:
        return False, True
    if res.kind != "stage":
        return True, False
    run = conn.execute(
        sa.select(runs.c.status, runs.c.cancel_requested).where(runs.c.id == res.run_id)
    ).first()
    stop = run is None or bool(run.cancel_requested) or run.status not in WORKING_RUN_STATUSES
    return True, stop


def release(
    conn: Connection,
    job_ids: Collection[int],
    worker: str,
    tokens: Collection[int] | None = None,
) -> int:
    """Give leases back (graceful shutdown): the jobs become claimable at once, same attempt.
    ``tokens``: the claim token of each job (in ``job_ids`` order) whose lease is given back;
    None: any claim of ``worker``."""
    if not job_ids:
        return 0
    if tokens is None:
        which = jobs.c.id.in_(list(job_ids))
    else:
        pairs = list(zip(job_ids, tokens, strict=True))
        which = sa.tuple_(jobs.c.id, jobs.c.lease_token).in_(pairs)
    res = conn.execute(
        sa.update(jobs)
        .where(which, jobs.c.lease_owner == worker, jobs.c.status == "leased")
        .values(status="ready", lease_owner=None, lease_expires_at=None)
    )
    if res.rowcount:
        notify_due(conn)
    return res.rowcount or 0


def reap_stale(conn: Connection, now: float) -> list[Any]:
    """Expired leases (their worker died, hung, or was starved of CPU so long that no
    heartbeat got through) become claimable again; the attempt is kept. Returns the jobs
    taken back, each with the ``lease_owner`` it was taken from, its ``wfv`` (the
    "workflow@version" a worker must serve to claim it) and ``overdue`` (seconds since the
    lease expired), so that the reaper can say whose work runs again, and where.

    The expired rows are locked first (PostgreSQL: a row a heartbeat is renewing right now
    is skipped, it is not stale), then given back."""
    clock = db_clock(conn, now)
    stale = (
        sa.select(
            jobs.c.id,
            jobs.c.run_id,
            jobs.c.stage_id,
            jobs.c.kind,
            jobs.c.lease_owner,
            jobs.c.wfv,
            (clock - jobs.c.lease_expires_at).label("overdue"),
        )
        .where(jobs.c.status == "leased", jobs.c.lease_expires_at < clock)
        .order_by(jobs.c.id)
    )
    if conn.dialect.name == "postgresql":
        stale = stale.with_for_update(of=jobs, skip_locked=True)
    rows = list(conn.execute(stale).all())
    if not rows:
        return []
    conn.execute(
        sa.update(jobs)
        .where(jobs.c.id.in_([r.id for r in rows]), jobs.c.status == "leased")
        .values(status="ready", lease_owner=None, lease_expires_at=None)
    )
    notify_due(conn)
    return rows


def poll_suspended(conn: Connection, now: float) -> int:
    """Suspended stages whose wake time has come become ready."""
    res = conn.execute(
        sa.update(jobs)
        .where(jobs.c.status == "waiting", jobs.c.available_at <= now)
        .values(status="ready")
    )
    if res.rowcount:
        notify_due(conn)
    return res.rowcount or 0


@functools.cache
def _claim_woken_stmt(postgres: bool) -> Any:
    clock: Any = db_clock_sql() if postgres else sa.bindparam("now", type_=sa.Float)
    one = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.run_id == sa.bindparam("b_run_id"),
            jobs.c.status == "ready",
            jobs.c.waiting_for == sa.bindparam("b_waiting_for"),
            jobs.c.available_at <= sa.bindparam("now", type_=sa.Float),
            jobs.c.wfv == sa.bindparam("wfv"),
        )
        .order_by(jobs.c.id)
        .limit(1)
    )
    return _lease_stmt(one, clock)


def claim_woken(
    conn: Connection,
    run: Any,
    waiting_for: str,
    served: Collection[str],
    worker: str,
    lease: float,
    now: float,
) -> tuple[Any, dict[str, Any]] | None:
    """The statement (and parameters) that leases to ``worker`` the job of ``run`` made
    ready from its ``waiting_for`` wait (a signal), if the run's "workflow@version" is
    ``served`` (None: it is not); run in the waking transaction after the wake (the run row
    is locked by the caller: nobody else claims it meanwhile), it returns the job row."""
    wfv = version_key(run.workflow_id, run.version)
    if wfv not in served:
        return None
    params = {
        "b_run_id": run.id,
        "b_waiting_for": waiting_for,
        "now": now,
        "wfv": wfv,
        "worker": worker,
        "lease": lease,
    }
    return _claim_woken_stmt(conn.dialect.name == "postgresql"), params
