"""The transactional outbox: events are rows written in the same transaction as the state
change they describe, then delivered to the EventSink in per-run order.

A failing sink is retried per event with exponential backoff (``next_attempt_at``); while a
run's oldest undelivered event waits for its retry, the run's later events wait behind it.
An event is dead-lettered only after ``dead_letter_after`` attempts that span at least
``outbox_dead_letter_min_seconds`` since its first failure (so a sink outage shorter than that
loses nothing), with a WARNING on the ``wfe.outbox`` logger.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql

from engine_port import EngineSettings, Event, EventDraft
from engine_port.driver import DeadLetteredEvent, DeadLetterLog, sink_retry_delay

from ._pgbatch import PLAN_EACH_TIME
from ._rawsql import execute, execute_many
from ._schema import outbox, runs
from ._sql import update_later

__all__ = [
    "OutboxCounts",
    "RetryRule",
    "append_events",
    "append_first_events",
    "count_outbox",
    "load_dead",
    "load_events",
    "log_dead",
    "mark_flushed",
    "pending_events",
    "renew_claims",
    "replay_dead",
]

log = logging.getLogger("wfe.outbox")


@dataclass(frozen=True)
class RetryRule:
    """When a failed delivery is retried, and when an event is given up (dead-lettered)."""

    dead_after: int = 10
    min_seconds: float = 300.0
    initial_seconds: float = 0.5
    max_seconds: float = 30.0

    @classmethod
    def from_settings(cls, s: EngineSettings) -> RetryRule:
        return cls(
            s.dead_letter_after,
            s.outbox_dead_letter_min_seconds,
            s.outbox_retry_initial_seconds,
            s.outbox_retry_max_seconds,
        )

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt (1, 2, ...)."""
        return sink_retry_delay(attempts, self.initial_seconds, self.max_seconds)

    def dead(self, attempts: int, first_failed_at: float, now: float) -> bool:
        return attempts >= self.dead_after and now - first_failed_at >= self.min_seconds


@dataclass(frozen=True)
class Pending:
    """An undelivered outbox row, as the flush reads it."""

    row_id: int
    attempts: int
    first_failed_at: float | None
    event: Event


@dataclass(frozen=True)
class OutboxCounts:
    pending: int = 0  # never failed yet
    retrying: int = 0  # failed at least once, waiting for (or in) a retry
    dead: int = 0  # dead-lettered: replay_dlq() re-queues them


def append_events(
    conn: Connection, run: Any, drafts: Sequence[EventDraft], now: float, **run_values: Any
) -> None:
    """Give ``drafts`` the run's next sequence numbers and write them to the outbox
    (``run_values`` are set on the run in the same statement)."""
    if not drafts:
        if run_values:
            update_later(conn, runs, {"id": run.id}, run_values)
        return
    params = {"k_id": run.id, "n_events": len(drafts)}
    params.update({f"v_{k}": v for k, v in run_values.items()})
    if conn.dialect.name == "postgresql":
        # one statement whose result nobody reads (the database numbers the events from
        # the run's counter), so it goes out with the commit: no round trip of its own
        params.update(_pg_event_arrays(run, drafts, now))
        execute(conn, _pg_append(tuple(run_values)), params, later=True)
        return
    seq = execute(conn, _seq_update(tuple(run_values)), params).scalar()
    first = seq - len(drafts) + 1
    execute_many(conn, _outbox_insert(), _event_rows(run, drafts, now, first))


def append_first_events(
    conn: Connection, run: Any, drafts: Sequence[EventDraft], now: float
) -> None:
    """Write the first events of a run created in this transaction, numbered 1, 2, ...: its
    row is inserted with ``event_seq = len(drafts)`` by the caller, so nothing updates it
    (``append_events`` takes the numbers from the run's row, a second version of it: on
    PostgreSQL, where the creation also sets its status, an update of every index of the
    run). Sent with the transaction's next statement on PostgreSQL."""
    if not drafts:
        return
    if conn.dialect.name == "postgresql":
        params = {"k_id": run.id, **_pg_event_arrays(run, drafts, now)}
        execute(conn, _pg_first_append(), params, later=True)
        return
    execute_many(conn, _outbox_insert(), _event_rows(run, drafts, now, 1), later=True)


def _pg_event_arrays(run: Any, drafts: Sequence[EventDraft], now: float) -> dict[str, Any]:
    """The events as the arrays of PostgreSQL's one-statement insert (``_pg_events_insert``)."""
    return {
        "e_workflow": run.workflow_id,
        "e_now": now,
        "e_ids": [d.id for d in drafts],
        "e_types": [d.type for d in drafts],
        "e_stages": [d.stage for d in drafts],
        "e_data": [json.dumps(d.data) for d in drafts],
        "e_business": [bool(d.business) for d in drafts],
    }


def _event_rows(
    run: Any, drafts: Sequence[EventDraft], now: float, first: int
) -> list[dict[str, Any]]:
    """The outbox rows of ``drafts``, numbered from ``first``, pending."""
    return [
        {
            "event_id": d.id,
            "run_id": run.id,
            "workflow_id": run.workflow_id,
            "seq": first + i,
            "type": d.type,
            "stage_id": d.stage,
            "data": d.data,
            "business": d.business,
            "created_at": now,
            "status": "pending",
            "attempts": 0,
            "first_failed_at": None,
            "next_attempt_at": None,
        }
        for i, d in enumerate(drafts)
    ]


@functools.cache
def _seq_update(keys: tuple[str, ...]) -> Any:
    """Take the run's next event sequence numbers (and set ``keys``): built once per shape."""
    return (
        sa.update(runs)
        .where(runs.c.id == sa.bindparam("k_id"))
        .values(
            event_seq=runs.c.event_seq + sa.bindparam("n_events", type_=sa.Integer),
            **{k: sa.bindparam(f"v_{k}") for k in keys},
        )
        .returning(runs.c.event_seq)
    )


@functools.cache
def _pg_append(keys: tuple[str, ...]) -> Any:
    """PostgreSQL: take the run's next sequence numbers (and set ``keys``) and insert the
    events numbered from them, in one statement (a data-modifying CTE; the events come as
    arrays, so the statement has one shape per ``keys`` whatever their number)."""
    return _pg_events_insert(_seq_update(keys).cte("taken"))


@functools.cache
def _pg_first_append() -> Any:
    """PostgreSQL: insert the events of :func:`append_first_events`, numbered 1, 2, ..."""
    return _pg_events_insert(None)


def _pg_events_insert(taken: Any) -> Any:
    """The events (arrays) inserted, numbered after the run's ``taken`` sequence numbers
    (None: from 1)."""
    arr = postgresql.ARRAY
    events = (
        sa.func.unnest(
            sa.bindparam("e_ids", type_=arr(sa.String)),
            sa.bindparam("e_types", type_=arr(sa.String)),
            sa.bindparam("e_stages", type_=arr(sa.String)),
            sa.bindparam("e_data", type_=arr(sa.Text)),
            sa.bindparam("e_business", type_=arr(sa.Boolean)),
        )
        .table_valued("event_id", "type", "stage_id", "data", "business", with_ordinality="i")
        .render_derived()
        .alias("ev")
    )
    rows = sa.select(
        events.c.event_id,
        sa.bindparam("k_id", type_=sa.String),
        sa.bindparam("e_workflow", type_=sa.String),
        events.c.i
        if taken is None
        else taken.c.event_seq - sa.bindparam("n_events", type_=sa.Integer) + events.c.i,
        events.c.type,
        events.c.stage_id,
        sa.cast(events.c.data, outbox.c.data.type),
        events.c.business,
        sa.bindparam("e_now", type_=sa.Double),
        sa.literal("pending"),
        sa.literal(0),
    )
    rows = (
        rows.select_from(events)
        if taken is None
        else rows.select_from(taken).join(events, sa.true())
    )
    cols = ["event_id", "run_id", "workflow_id", "seq", "type", "stage_id", "data"]
    cols += ["business", "created_at", "status", "attempts"]
    return outbox.insert().from_select(cols, rows)


@functools.cache
def _outbox_insert() -> Any:
    return outbox.insert().values({c: sa.bindparam(c, type_=outbox.c[c].type) for c in _ROW})


_ROW = (
    "event_id",
    "run_id",
    "workflow_id",
    "seq",
    "type",
    "stage_id",
    "data",
    "business",
    "created_at",
    "status",
    "attempts",
    "first_failed_at",
    "next_attempt_at",
)
"""The columns ``append_events`` writes (SQLite)."""


def _event(row: Any) -> Event:
    from datetime import UTC, datetime

    return Event(
        id=row.event_id,
        run_id=row.run_id,
        seq=row.seq,
        type=row.type,
        workflow_id=row.workflow_id,
        stage=row.stage_id,
        data=row.data or {},
        business=bool(row.business),
        at=datetime.fromtimestamp(row.created_at, UTC),
    )


_HELD_ROWS = outbox.alias("held")
_HELD = sa.and_(
    _HELD_ROWS.c.status == sa.literal_column("'pending'"),
    sa.or_(_HELD_ROWS.c.claimed_until.is_not(None), _HELD_ROWS.c.next_attempt_at.is_not(None)),
)
"""``HELD_PREDICATE`` of the schema, said of the ``held`` rows (so a planner uses
``ix_wfe_outbox_held``: ``test_outbox_scale`` reads the plan)."""

_FLUSH_LOCK = 724402
"""PostgreSQL advisory lock id: one flush claims rows at a time (the others skip a round)."""


def pending_events(
    conn: Connection,
    limit: int,
    due_at: float | None,
    flusher: str = "",
    now: float = 0.0,
    claim_seconds: float = 30.0,
) -> tuple[list[Pending], int]:
    """Claim undelivered events to try now, in write order, for ``flusher`` (until
    ``now + claim_seconds``), and count how many wait for a later retry.

    An event is skipped while any undelivered event of its run, itself included, is claimed
    by a flush (so two workers never publish the same event, and a run's events stay in
    order across workers) or, with ``due_at`` (the current time), waits for a retry later
    than that (per-run order); ``None`` tries every unclaimed event (``flush_events()``)."""
    if conn.dialect.name == "postgresql":
        got = conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(_FLUSH_LOCK))).scalar()
        if not got:
            return [], 0  # another flush is claiming right now: its rows are not ours
    held = _HELD_ROWS
    blocked = held.c.claimed_until > now
    if due_at is not None:
        blocked = sa.or_(blocked, held.c.next_attempt_at > due_at)
    query = sa.select(outbox).where(
        outbox.c.status == "pending",
        ~sa.exists().where(
            held.c.run_id == outbox.c.run_id,
            held.c.seq <= outbox.c.seq,
            # (the partial index of held events, in its literal words: the earlier events
            # of the run that a flush waits for, not every earlier event of it)
            _HELD,
            blocked,
        ),
    )
    waiting = 0
    if due_at is not None:
        # (only a failed event waits for a retry: counted by the partial index of those,
        # not by reading every undelivered row)
        waiting = conn.execute(_WAITING, {"due": due_at}).scalar_one()
    # (planned for its values each time: see PLAN_EACH_TIME)
    query = query.prefix_with(PLAN_EACH_TIME, dialect="postgresql")
    rows = conn.execute(query.order_by(outbox.c.id).limit(limit)).all()
    if rows:
        conn.execute(
            sa.update(outbox)
            .where(outbox.c.id.in_([r.id for r in rows]))
            .values(claimed_by=flusher, claimed_until=now + claim_seconds)
        )
    return [Pending(r.id, r.attempts, r.first_failed_at, _event(r)) for r in rows], waiting


def renew_claims(
    conn: Connection, row_ids: Sequence[int], flusher: str, now: float, until: float
) -> set[int]:
    """Extend ``flusher``'s claims of ``row_ids`` (undelivered) to ``until``: the ids it still
    held. A claim that lapsed is not renewed (another flush may have read it as free already,
    and claims it by id), nor one another flusher took."""
    got = conn.execute(
        sa.update(outbox)
        .where(
            outbox.c.id.in_(list(row_ids)),
            outbox.c.claimed_by == flusher,
            outbox.c.claimed_until > now,
            outbox.c.status == "pending",
        )
        .values(claimed_until=until)
        .returning(outbox.c.id)
    )
    return {int(r[0]) for r in got}


def mark_flushed(
    conn: Connection,
    delivered: Iterable[int],
    failed: Sequence[tuple[Sequence[Pending], str]],
    rule: RetryRule,
    now: float,
) -> list[DeadLetteredEvent]:
    """Mark rows delivered; for each failed run batch (its rows, the sink's error) count an
    attempt, schedule the retry and dead-letter the rows past ``rule``. Returns the dead ones."""
    ids = list(delivered)
    if ids:
        conn.execute(
            sa.update(outbox)
            .where(outbox.c.id.in_(ids))
            .values(status="delivered", claimed_by=None, claimed_until=None)
        )
    updates: list[dict[str, Any]] = []
    dead: list[DeadLetteredEvent] = []
    for rows, error in failed:
        # the batch is retried together, when its oldest event is due
        retry_at = now + rule.delay(max(p.attempts for p in rows) + 1)
        for p in rows:
            attempts = p.attempts + 1
            first = p.first_failed_at if p.first_failed_at is not None else now
            gone = rule.dead(attempts, first, now)
            updates.append(
                {
                    "row_id": p.row_id,
                    "new_status": "dead" if gone else "pending",
                    "new_attempts": attempts,
                    "new_error": error,
                    "new_first": first,
                    "new_next": None if gone else retry_at,
                }
            )
            if gone:
                e = p.event
                dead.append(DeadLetteredEvent(e.id, e.run_id, e.seq, attempts, error))
    if updates:
        conn.execute(
            sa.update(outbox)
            .where(outbox.c.id == sa.bindparam("row_id"))
            .values(
                status=sa.bindparam("new_status"),
                attempts=sa.bindparam("new_attempts"),
                last_error=sa.bindparam("new_error"),
                first_failed_at=sa.bindparam("new_first"),
                next_attempt_at=sa.bindparam("new_next"),
                claimed_by=None,
                claimed_until=None,
            ),
            updates,
        )
    return dead


def log_dead(dead: Sequence[DeadLetteredEvent], rule: RetryRule) -> None:
    """Log one flush's dead letters: the first few at WARNING, the rest at DEBUG with one
    WARNING counting them (``DeadLetterLog``; a backlog once logged a warning per event)."""
    DeadLetterLog(log).log_batch(dead, min_seconds=rule.min_seconds, scope="flush")


def count_outbox(conn: Connection) -> OutboxCounts:
    """Undelivered events never tried or not failed yet, failing and retrying, dead.

    Each count reads an index only, never the rows: undelivered and dead events by
    ``ix_wfe_outbox_status``, the retrying ones by the partial index of events that failed
    (``ix_wfe_outbox_failing``; literal values, which a planner needs to use a partial
    index). Grouping by ``attempts > 0`` read every undelivered row: 0.75 s for a million
    events on SQLite, which pile up where no host has a sink (bench/README.md)."""
    by_status: dict[str, int] = {str(s): int(n) for s, n in conn.execute(_BY_STATUS).all()}
    retrying = int(conn.execute(_RETRYING).scalar_one())
    return OutboxCounts(
        pending=by_status.get("pending", 0) - retrying,
        retrying=retrying,
        dead=by_status.get("dead", 0),
    )


_WAITING = sa.text(
    "SELECT count(*) FROM wfe_outbox WHERE attempts > 0 AND status = 'pending'"
    " AND next_attempt_at > :due"
)
_BY_STATUS = sa.text(
    "SELECT status, count(*) FROM wfe_outbox WHERE status IN ('pending', 'dead') GROUP BY status"
)
_RETRYING = sa.text("SELECT count(*) FROM wfe_outbox WHERE attempts > 0 AND status = 'pending'")


def replay_dead(conn: Connection) -> int:
    res = conn.execute(
        sa.update(outbox)
        .where(outbox.c.status == "dead")
        .values(status="pending", attempts=0, first_failed_at=None, next_attempt_at=None)
    )
    return res.rowcount or 0


def load_events(
    conn: Connection, run_id: str, after_seq: int | None = None, limit: int | None = None
) -> list[Event]:
    """The run's events in sequence order: those after ``after_seq``, at most ``limit``; a
    range read of ``ix_wfe_outbox_run`` (run id, seq) however deep the page is."""
    query = sa.select(outbox).where(outbox.c.run_id == run_id)
    if after_seq is not None:
        query = query.where(outbox.c.seq > after_seq)
    query = query.order_by(outbox.c.seq)
    if limit is not None:
        query = query.limit(limit)
    return [_event(r) for r in conn.execute(query).all()]


def load_dead(conn: Connection, limit: int) -> list[Event]:
    """Dead-lettered events, oldest first."""
    rows = conn.execute(
        sa.select(outbox).where(outbox.c.status == "dead").order_by(outbox.c.id).limit(limit)
    ).all()
    return [_event(r) for r in rows]
