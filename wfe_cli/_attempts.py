"""A run's attempt history, read from its lifecycle events (``wfe show --events``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from engine_port import ErrorInfo, Event, RunInfo

__all__ = ["AttemptRecord", "attempt_history"]


class AttemptRecord(BaseModel):
    """One attempt of one stage: when it started and ended, and how."""

    stage: str
    attempt: int
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str = "running"  # running | completed | failed | suspended | cancelled
    will_retry: bool | None = None
    error: ErrorInfo | None = None


_ENDS = {
    "stage.completed": "completed",
    "stage.failed": "failed",
    "stage.suspended": "suspended",
    "stage.cancelled": "cancelled",
}


def attempt_history(events: Sequence[Event], run: RunInfo | None = None) -> list[AttemptRecord]:
    """Attempts in the order they started. A suspended attempt that resumes stays one
    attempt (its outcome is the last one seen). The error of the stage's last failed attempt
    carries the traceback recorded on the stage (events carry type and message only)."""
    out: list[AttemptRecord] = []
    open_: dict[tuple[str, int], AttemptRecord] = {}
    latest: dict[str, AttemptRecord] = {}
    for e in sorted(events, key=lambda e: e.seq):
        if e.stage is None or e.business:
            continue
        number = e.data.get("attempt")
        attempt = int(number) if isinstance(number, int) else None
        if e.type == "stage.started" and attempt is not None:
            rec = open_.get((e.stage, attempt))
            if rec is None:
                rec = AttemptRecord(stage=e.stage, attempt=attempt, started_at=e.at)
                open_[(e.stage, attempt)] = rec
                out.append(rec)
            rec.outcome = "running"
            latest[e.stage] = rec
            continue
        outcome = _ENDS.get(e.type)
        if outcome is None:
            continue
        found = latest.get(e.stage) if attempt is None else open_.get((e.stage, attempt))
        if found is None:
            continue
        found.outcome = outcome
        found.ended_at = e.at
        if e.type == "stage.failed":
            found.will_retry = bool(e.data.get("will_retry"))
            found.error = _error(e.data.get("error"))
    if run is not None:
        for stage in run.stages:
            last = latest.get(stage.id)
            if (
                last is not None
                and last.outcome == "failed"
                and last.attempt == stage.attempt
                and stage.error is not None
            ):
                last.error = stage.error
    return out


def _error(raw: Any) -> ErrorInfo | None:
    if not isinstance(raw, dict):
        return None
    return ErrorInfo(type=str(raw.get("type", "")), message=str(raw.get("message", "")))
