"""The step ledger on the database: one row per step, each write its own transaction.

Only the claim holding the stage's job lease journals a step or takes a signal: each write
checks the lease (worker and claim token, ``_jobs.held``) in the statement that makes it (on
PostgreSQL locking the job row FOR SHARE until the commit, so that a reap or a claim cannot
take the job over in between), at no cost in round trips. A worker whose lease was taken over
while it stalled (it has not noticed at a heartbeat yet; the taker may be that same worker,
claiming the job again) writes nothing: the attempt now belongs to the new owner, which must
replay only what was journaled before the takeover (DESIGN §5); the stale attempt is stopped
as a heartbeat that found the lease gone would stop it.

Large step results go to the blob store behind a reference (claim check)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from engine_port import ClaimCheck, StepRecord

from ._db import Database, commit_was_unknown, commit_with_next
from ._jobs import Lease, held
from ._rawsql import execute, execute_together
from ._schema import signals, steps
from ._sql import upsert

__all__ = ["LeaseTerm", "SqlStepLedger", "hand_over", "journal", "step_record"]

_MISSING = object()
_LOST = object()
"""What a ledger write returns when the job is no longer leased to the writing worker."""

_COLUMNS = (
    "run_id",
    "stage_id",
    "name",
    "kind",
    "completed",
    "result",
    "deadline",
    "signal",
    "meta",
)
_KEYS = ("run_id", "stage_id", "name")


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def step_record(row: Any) -> StepRecord:
    return StepRecord(
        name=row.name,
        kind=row.kind,
        completed=bool(row.completed),
        result=row.result,
        deadline=_dt(row.deadline),
        signal=row.signal,
        meta=row.meta,
    )


def _row(run_id: str, stage_id: str, rec: StepRecord, result: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "stage_id": stage_id,
        "name": rec.name,
        "kind": rec.kind,
        "completed": rec.completed,
        "result": result,
        "deadline": _ts(rec.deadline),
        "signal": rec.signal,
        "meta": rec.meta,
    }


@functools.cache
def _journal_stmt(postgres: bool) -> Any:
    """The step row's upsert, made only while the job is leased to the writer: ``INSERT ...
    SELECT :values WHERE EXISTS (lease) ON CONFLICT DO UPDATE`` (row count 0: lease lost)."""

    def value(c: str) -> Any:
        bound = sa.bindparam(c, type_=steps.c[c].type)
        # (PostgreSQL types a select list's parameters as text unless told; on SQLite a cast
        # would give a JSON value NUMERIC affinity)
        return sa.cast(bound, steps.c[c].type) if postgres else bound

    values = sa.select(*(value(c) for c in _COLUMNS)).where(held(postgres).exists())
    ins: Any = (postgresql if postgres else sqlite).insert(steps).from_select(_COLUMNS, values)
    update = {c: ins.excluded[c] for c in _COLUMNS if c not in _KEYS}
    return ins.on_conflict_do_update(index_elements=list(_KEYS), set_=update)


def journal(conn: Connection, values: dict[str, Any], lease: Lease) -> bool:
    """Journal a step row (``_row``) if the job is still held under ``lease``; False
    (nothing written) if not. On PostgreSQL BEGIN, the write and COMMIT go out in one round
    trip, as a deferred write would, with the row count read back."""
    stmt = _journal_stmt(conn.dialect.name == "postgresql")
    commit_with_next(conn)
    [res] = execute_together(conn, [(stmt, {**values, **lease.params()})])
    return res.rowcount > 0


@functools.cache
def _oldest_signal() -> Any:
    return (
        sa.select(signals.c.id, signals.c.payload)
        .where(
            signals.c.run_id == sa.bindparam("run_id"),
            signals.c.name == sa.bindparam("name"),
            signals.c.consumed.is_(False),
        )
        .order_by(signals.c.id)
        .limit(1)
    )


@functools.cache
def _take_signal() -> Any:
    return (
        sa.update(signals)
        .where(signals.c.id == sa.bindparam("id"), signals.c.consumed.is_(False))
        .values(consumed=True)
    )


@functools.cache
def _owned_oldest() -> Any:
    """SQLite: whether the job is still leased to the worker (``owned``; no row at all: it is
    not) and the oldest unconsumed signal of the name (``id`` None: there is none). SQLite
    runs one writer at a time: the lease cannot be taken over before this transaction ends."""
    lease = held(False).subquery("lease")
    oldest = _oldest_signal().subquery("oldest")
    return sa.select(lease.c.id.label("owned"), oldest.c.id, oldest.c.payload).select_from(
        lease.outerjoin(oldest, sa.true())
    )


@functools.cache
def _read_and_take() -> Any:
    """PostgreSQL: the job's lease checked (and its row locked FOR SHARE), the oldest
    unconsumed signal of the name and, in the same statement, its guarded take (a
    data-modifying CTE). No row at all: the job is not leased to the worker (nothing taken);
    ``id`` None: there is no signal; ``taken`` None: a parallel stage of the run took it
    first."""
    lease = held(True).cte("lease")
    oldest = _oldest_signal().where(sa.exists(sa.select(lease.c.id))).cte("oldest")
    taken = (
        sa.update(signals)
        .where(signals.c.id.in_(sa.select(oldest.c.id)), signals.c.consumed.is_(False))
        .values(consumed=True)
        .returning(signals.c.id)
        .cte("taken")
    )
    return sa.select(
        lease.c.id.label("owned"), oldest.c.id, oldest.c.payload, taken.c.id.label("taken")
    ).select_from(lease.outerjoin(oldest, sa.true()).outerjoin(taken, sa.true()))


def _consume(conn: Connection, run_id: str, stage_id: str, rec: StepRecord, lease: Lease) -> Any:
    """Take the oldest unconsumed signal named ``rec.signal`` and journal ``rec`` with its
    payload, in one transaction, if the job is still held under ``lease`` (else
    ``_LOST``, nothing taken: the lease is checked in the statement that reads the signal,
    and holds until the commit). Parallel stages of one run may race for the same row: the
    loser's guarded update matches nothing and it takes the next one.

    A re-run after a commit whose acknowledgement was lost returns the payload it journaled
    then: it must not take a second signal, nor report none and let the wait overwrite the
    step."""
    if commit_was_unknown():
        done = conn.execute(
            sa.select(steps.c.result).where(
                steps.c.run_id == run_id,
                steps.c.stage_id == stage_id,
                steps.c.name == rec.name,
                steps.c.completed.is_(True),
            )
        ).first()
        if done is not None:
            return done.result
    params = {"run_id": run_id, "name": rec.signal, **lease.params()}
    postgres = conn.dialect.name == "postgresql"
    while True:
        if postgres:  # lease check, read and take in one statement (one round trip)
            row = execute(conn, _read_and_take(), params).first()
            if row is None:
                return _LOST
            if row.id is None:
                return _MISSING
            if row.taken is not None:
                break
            continue
        row = execute(conn, _owned_oldest(), params).first()
        if row is None:
            return _LOST
        if row.id is None:
            return _MISSING
        taken = execute(conn, _take_signal(), {"id": row.id})
        if taken.rowcount == 1:
            break
    upsert(
        conn,
        steps,
        _row(run_id, stage_id, rec.done(row.payload), row.payload),
        ("run_id", "stage_id", "name"),
    )
    return row.payload


@functools.cache
def _take_named() -> Any:
    return (
        sa.update(signals)
        .where(
            signals.c.run_id == sa.bindparam("run_id"),
            signals.c.name == sa.bindparam("name"),
            signals.c.consumed.is_(False),
        )
        .values(consumed=True)
    )


def hand_over(
    conn: Connection,
    run_id: str,
    stage_id: str,
    rows: list[Any],
    name: str,
    payload: Any,
    *,
    gate: bool = False,
) -> list[Any]:
    """In the transaction that queued signal ``name`` (stored form ``payload``), the only
    unconsumed one of its name, and began the stage it woke: the stage's suspended wait for
    it takes it, as ``_consume`` would when the stage replays (the signal consumed, the step
    journaled with its payload). ``gate``: the stage starts on ``name`` (``after_signal``);
    without a row of that name its gate is what waits (a gate with no deadline journals
    nothing while it waits), and it takes the signal as its step ``name``. Returns the
    stage's step rows as the replay must see them; unchanged when the stage has no single
    open wait for ``name``."""
    open_waits = [
        i for i, r in enumerate(rows) if r.kind == "signal" and r.signal == name and not r.completed
    ]
    if not open_waits and gate and all(r.name != name for r in rows):
        rec = StepRecord(name=name, kind="signal", completed=False, signal=name).done(payload)
        _take(conn, run_id, stage_id, rec, payload)
        return [*rows, SimpleNamespace(**_row(run_id, stage_id, rec, payload))]
    if len(open_waits) != 1:
        return rows
    i = open_waits[0]
    rec = step_record(rows[i]).done(payload)
    _take(conn, run_id, stage_id, rec, payload)
    taken = SimpleNamespace(
        **{**rows[i]._asdict(), "completed": True, "result": payload, "meta": rec.meta}
    )
    return [*rows[:i], taken, *rows[i + 1 :]]


def _take(conn: Connection, run_id: str, stage_id: str, rec: StepRecord, payload: Any) -> None:
    """``hand_over``'s writes: the run's signals of the name consumed (there is one), the
    wait's step journaled with the payload."""
    execute(conn, _take_named(), {"run_id": run_id, "name": rec.signal}, later=True)
    upsert(conn, steps, _row(run_id, stage_id, rec, payload), ("run_id", "stage_id", "name"))


class LeaseTerm:
    """When the lease of an attempt was last extended (the claim, then each heartbeat that
    got through), on this process's monotonic clock: a write checks the lease in its
    statement, but a step body runs before its write. A worker paused (SIGSTOP, a VM
    migrated, a loop held) past its lease and resumed went on with its attempt until its
    next write found the lease gone, running on the way the body of a step the new owner had
    journaled meanwhile. So before a body runs, a lease that may have lapsed (half its
    length gone with no extension seen: :meth:`check`) is renewed first, and the attempt
    stops if it is no longer ours; in a worker whose heartbeats get through, never."""

    __slots__ = ("_renew", "renewed_at", "seconds")

    def __init__(self, seconds: float, renew: Callable[[], Awaitable[bool]]) -> None:
        self.seconds = seconds
        self._renew = renew  # a heartbeat: whether the lease was still ours (and is extended)
        self.renewed_at = time.monotonic()

    async def check(self) -> bool:
        """Whether the lease is still ours (renewed first if it may have lapsed)."""
        if time.monotonic() - self.renewed_at < self.seconds / 2:
            return True
        started = time.monotonic()
        if not await self._renew():
            return False
        self.renewed_at = max(self.renewed_at, started)
        return True


class SqlStepLedger:
    """The ledger of one stage of one run, written under the claim ``lease`` of its job.
    Only the claim holding the stage's lease writes it, so reads are served from what was
    loaded at the start of the attempt. A write that finds the lease gone writes
    nothing, calls ``on_lost`` (which stops the attempt) and raises ``CancelledError``."""

    def __init__(
        self,
        db: Database,
        claim: ClaimCheck,
        run_id: str,
        stage_id: str,
        rows: list[Any],
        *,
        lease: Lease,
        on_lost: Callable[[], None],
        term: LeaseTerm | None = None,
    ) -> None:
        self._db = db
        self._term = term
        self._claim = claim
        self.run_id = run_id
        self.stage_id = stage_id
        self._lease = lease
        self._on_lost = on_lost
        self._cache = {r.name: step_record(r) for r in rows}
        # the stored form of each completed result read from the database, opened on first use
        self._stored = {n: rec.result for n, rec in self._cache.items() if rec.completed}

    @functools.cached_property
    def _token(self) -> str:
        """In the keys of this ledger's spilled step results: a stale attempt's blob must
        never overwrite the one the new owner's journaled row refers to (same step, same
        key). Made at its first use (most stages spill nothing)."""
        return uuid.uuid4().hex[:8]

    async def get(self, name: str) -> StepRecord | None:
        rec = self._cache.get(name)
        if rec is not None and name in self._stored:
            rec = rec.loaded(await self._claim.load(self._stored.pop(name), run_id=self.run_id))
            self._cache[name] = rec
        # (what is not journaled may run next: not on a lease another owner took over)
        unjournaled = rec is None or not rec.completed
        if unjournaled and self._term is not None and not await self._term.check():
            self._lost()
        return rec

    async def put(self, record: StepRecord) -> None:
        stored = record.result
        if record.completed and record.result is not None:
            digest = hashlib.sha256(record.name.encode()).hexdigest()[:24]
            prefix = f"runs/{self.run_id}/steps/{self.stage_id}/{digest}-"

            def key() -> str:  # (called only if the result spills)
                return prefix + self._token

            stored = await self._claim.dump(record.result, key)
        row = _row(self.run_id, self.stage_id, record, stored)
        if not await self._db.tx(journal, row, self._lease):
            spilled = self._claim.key_of(stored)
            if spilled is not None:
                with contextlib.suppress(Exception):  # (else it goes with the run's purge)
                    await self._claim.store.delete(spilled)
            self._lost()
        self._cache[record.name] = record
        self._stored.pop(record.name, None)

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        payload = await self._db.tx(_consume, self.run_id, self.stage_id, record, self._lease)
        if payload is _LOST:
            self._lost()
        if payload is _MISSING:
            return None
        done = record.done(await self._claim.load(payload, run_id=self.run_id))
        self._cache[record.name] = done
        return done

    def _lost(self) -> None:
        """The lease is gone (taken over): the attempt stops here, as when a heartbeat finds
        the lease gone; its outcome is discarded (the job is not ours to record it)."""
        self._on_lost()
        lease = self._lease
        raise asyncio.CancelledError(f"job {lease.job_id}: the lease of {lease.worker} is gone")
