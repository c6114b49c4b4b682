"""The transactional outbox: events are rows written in the same transaction as the state
change they describe, then delivered to the EventSink in per-run order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port import Event, EventDraft

from ._schema import outbox, runs

__all__ = ["append_events", "load_events", "mark_flushed", "pending_events", "replay_dead"]


def append_events(
    conn: Connection, run: Any, drafts: Sequence[EventDraft], now: float, **run_values: Any
) -> None:
    """Give ``drafts`` the run's next sequence numbers and write them to the outbox
    (``run_values`` are set on the run in the same statement)."""
    if not drafts:
        if run_values:
            conn.execute(sa.update(runs).where(runs.c.id == run.id).values(**run_values))
        return
    seq = conn.execute(
        sa.update(runs)
        .where(runs.c.id == run.id)
        .values(event_seq=runs.c.event_seq + len(drafts), **run_values)
        .returning(runs.c.event_seq)
    ).scalar_one()
    first = seq - len(drafts) + 1
    conn.execute(
        outbox.insert(),
        [
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
            }
            for i, d in enumerate(drafts)
        ],
    )


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


def pending_events(conn: Connection, limit: int) -> list[tuple[int, int, Event]]:
    """(outbox row id, attempts, event) of undelivered events, in write order."""
    rows = conn.execute(
        sa.select(outbox).where(outbox.c.status == "pending").order_by(outbox.c.id).limit(limit)
    ).all()
    return [(r.id, r.attempts, _event(r)) for r in rows]


def mark_flushed(
    conn: Connection,
    delivered: Iterable[int],
    failed: Iterable[int],
    error: str | None,
    dead_after: int,
) -> int:
    """Mark rows delivered, or count a failed attempt (dead-lettering after ``dead_after``);
    returns how many rows went to the dead-letter state."""
    ids = list(delivered)
    if ids:
        conn.execute(sa.update(outbox).where(outbox.c.id.in_(ids)).values(status="delivered"))
    failed_ids = list(failed)
    if not failed_ids:
        return 0
    conn.execute(
        sa.update(outbox)
        .where(outbox.c.id.in_(failed_ids))
        .values(attempts=outbox.c.attempts + 1, last_error=error)
    )
    res = conn.execute(
        sa.update(outbox)
        .where(outbox.c.id.in_(failed_ids), outbox.c.attempts >= dead_after)
        .values(status="dead")
    )
    return res.rowcount or 0


def replay_dead(conn: Connection) -> int:
    res = conn.execute(
        sa.update(outbox).where(outbox.c.status == "dead").values(status="pending", attempts=0)
    )
    return res.rowcount or 0


def load_events(conn: Connection, run_id: str) -> list[Event]:
    rows = conn.execute(
        sa.select(outbox).where(outbox.c.run_id == run_id).order_by(outbox.c.seq)
    ).all()
    return [_event(r) for r in rows]
