"""The step ledger on the database: one row per step, each write its own transaction.

Large step results go to the blob store behind a reference (claim check)."""

from __future__ import annotations

import functools
import hashlib
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port import ClaimCheck, StepRecord

from ._db import Database, commit_was_unknown
from ._rawsql import execute
from ._schema import signals, steps
from ._sql import upsert

__all__ = ["SqlStepLedger", "hand_over", "step_record"]

_MISSING = object()


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
    }


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
def _read_and_take() -> Any:
    """PostgreSQL: the oldest unconsumed signal of the name and, in the same statement, its
    guarded take (a data-modifying CTE): ``taken`` is None when a parallel stage of the run
    took it first (no row at all: there is none)."""
    oldest = _oldest_signal().cte("oldest")
    taken = (
        sa.update(signals)
        .where(signals.c.id.in_(sa.select(oldest.c.id)), signals.c.consumed.is_(False))
        .values(consumed=True)
        .returning(signals.c.id)
        .cte("taken")
    )
    return sa.select(oldest.c.id, oldest.c.payload, taken.c.id.label("taken")).select_from(
        oldest.outerjoin(taken, sa.true())
    )


def _consume(conn: Connection, run_id: str, stage_id: str, rec: StepRecord) -> Any:
    """Take the oldest unconsumed signal named ``rec.signal`` and journal ``rec`` with its
    payload, in one transaction. Parallel stages of one run may race for the same row: the
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
    params = {"run_id": run_id, "name": rec.signal}
    postgres = conn.dialect.name == "postgresql"
    while True:
        if postgres:  # read and take in one statement (one round trip)
            row = execute(conn, _read_and_take(), params).first()
            if row is None:
                return _MISSING
            if row.taken is not None:
                break
            continue
        row = execute(conn, _oldest_signal(), params).first()
        if row is None:
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
    conn: Connection, run_id: str, stage_id: str, rows: list[Any], name: str, payload: Any
) -> list[Any]:
    """In the transaction that queued signal ``name`` (stored form ``payload``), the only
    unconsumed one of its name, and began the stage it woke: the stage's suspended wait for
    it takes it, as ``_consume`` would when the stage replays (the signal consumed, the step
    journaled with its payload). Returns the stage's step rows as the replay must see them;
    unchanged when the stage has no single open wait for ``name``."""
    open_waits = [
        i for i, r in enumerate(rows) if r.kind == "signal" and r.signal == name and not r.completed
    ]
    if len(open_waits) != 1:
        return rows
    i = open_waits[0]
    rec = step_record(rows[i]).done(payload)
    execute(conn, _take_named(), {"run_id": run_id, "name": name}, later=True)
    upsert(conn, steps, _row(run_id, stage_id, rec, payload), ("run_id", "stage_id", "name"))
    taken = SimpleNamespace(**{**rows[i]._asdict(), "completed": True, "result": payload})
    return [*rows[:i], taken, *rows[i + 1 :]]


class SqlStepLedger:
    """The ledger of one stage of one run. Only the job holding the stage's lease writes it,
    so reads are served from what was loaded at the start of the attempt."""

    def __init__(
        self, db: Database, claim: ClaimCheck, run_id: str, stage_id: str, rows: list[Any]
    ) -> None:
        self._db = db
        self._claim = claim
        self.run_id = run_id
        self.stage_id = stage_id
        self._cache = {r.name: step_record(r) for r in rows}
        # the stored form of each completed result read from the database, opened on first use
        self._stored = {n: rec.result for n, rec in self._cache.items() if rec.completed}

    async def get(self, name: str) -> StepRecord | None:
        rec = self._cache.get(name)
        if rec is not None and name in self._stored:
            rec = rec.done(await self._claim.load(self._stored.pop(name), run_id=self.run_id))
            self._cache[name] = rec
        return rec

    async def put(self, record: StepRecord) -> None:
        stored = record.result
        if record.completed and record.result is not None:
            digest = hashlib.sha256(record.name.encode()).hexdigest()[:24]
            key = f"runs/{self.run_id}/steps/{self.stage_id}/{digest}"
            stored = await self._claim.dump(record.result, key)
        await self._db.tx(
            upsert,
            steps,
            _row(self.run_id, self.stage_id, record, stored),
            ("run_id", "stage_id", "name"),
        )
        self._cache[record.name] = record
        self._stored.pop(record.name, None)

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        payload = await self._db.tx(_consume, self.run_id, self.stage_id, record)
        if payload is _MISSING:
            return None
        done = record.done(await self._claim.load(payload, run_id=self.run_id))
        self._cache[record.name] = done
        return done
