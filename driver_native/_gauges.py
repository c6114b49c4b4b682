"""What the native database says right now, for a worker's ``/metrics`` (issue 14): runs
per workflow and status, and when the oldest due job became due (the queue lag)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from ._schema import jobs, runs

__all__ = ["read_gauges"]


def read_gauges(conn: Connection, now: float) -> dict[str, Any]:
    """``runs``: {(workflow, status): count}; ``queue_lag_s``: how long the oldest job that
    is due (ready, or waiting with its time come) has waited for a worker (0 without one)."""
    rows = conn.execute(
        sa.select(runs.c.workflow_id, runs.c.status, sa.func.count()).group_by(
            runs.c.workflow_id, runs.c.status
        )
    ).all()
    oldest = conn.execute(
        sa.select(sa.func.min(jobs.c.available_at)).where(
            jobs.c.status.in_(("ready", "waiting")),
            jobs.c.available_at.is_not(None),
            jobs.c.available_at <= now,
        )
    ).scalar()
    return {
        "runs": {(str(wf), str(status)): int(n) for wf, status, n in rows},
        "queue_lag_s": 0.0 if oldest is None else max(0.0, now - float(oldest)),
    }
