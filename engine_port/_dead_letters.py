"""The warning every driver logs for an event it gives up delivering (a dead letter), written
once so an operator reads the same line, with the same ``wfe_*`` fields, on every driver."""

from __future__ import annotations

import logging

__all__ = ["log_dead_letter"]


def log_dead_letter(
    log: logging.Logger,
    *,
    event_id: str,
    seq: int,
    run_id: str,
    error: str | None,
    attempts: int | None = None,
    min_seconds: float | None = None,
) -> None:
    """Warn that event ``event_id`` (``seq`` of run ``run_id``) was dead-lettered after
    ``attempts`` failed deliveries spanning at least ``min_seconds`` (when the driver knows
    them), the sink's last ``error``, and what to do. The record carries ``wfe_run_id``,
    ``wfe_event_id``, ``wfe_event_seq`` and ``wfe_sink_error`` (a JSON log writes them)."""
    if attempts is not None and min_seconds is not None:
        after = f"after {attempts} failed deliveries over at least {min_seconds:g}s"
    else:
        after = "after its failed deliveries spanned the dead-letter rule"
    log.warning(
        "outbox: event %s (seq %d) of run %s dead-lettered %s; last sink error: %s. Fix the "
        "sink, then replay_dlq() re-queues it",
        event_id,
        seq,
        run_id,
        after,
        error or "unknown",
        extra={
            "wfe_run_id": run_id,
            "wfe_event_id": event_id,
            "wfe_event_seq": seq,
            "wfe_sink_error": error,
            "event_id": event_id,  # (the names before 2026-12-05)
            "run_id": run_id,
            "sink_error": error,
        },
    )
