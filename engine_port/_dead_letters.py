"""The warning every driver logs for an event it gives up delivering (a dead letter), written
once so an operator reads the same line, with the same ``wfe_*`` fields, on every driver.

A sink outage with a backlog dead-letters many events at once (about 200 warnings in 2 s,
2026-12-05): ``DeadLetterLog`` warns for the first few of a batch (``warn_first``), logs the
rest at DEBUG and sums them up in one warning, so an operator reads a handful of lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["DeadLetterLog", "DeadLetteredEvent", "log_dead_letter"]

WARN_FIRST = 3  # dead letters of a batch (or window) logged at WARNING, the rest at DEBUG
_WHAT_TO_DO = "`wfe dlq list` shows them, `wfe dlq replay` sends them again"


@dataclass(frozen=True)
class DeadLetteredEvent:
    """An event given up: its id, run and sequence number, the failed deliveries (when the
    driver counts them) and the sink's last error."""

    event_id: str
    run_id: str
    seq: int
    attempts: int | None = None
    error: str | None = None


def log_dead_letter(
    log: logging.Logger,
    *,
    event_id: str,
    seq: int,
    run_id: str,
    error: str | None,
    attempts: int | None = None,
    min_seconds: float | None = None,
    level: int = logging.WARNING,
) -> None:
    """Log (a warning unless ``level``) that event ``event_id`` (``seq`` of run ``run_id``)
    was dead-lettered after ``attempts`` failed deliveries spanning at least ``min_seconds``
    (when the driver knows them), the sink's last ``error``, and what to do. The record
    carries ``wfe_run_id``, ``wfe_event_id``, ``wfe_event_seq`` and ``wfe_sink_error`` (a JSON
    log writes them). Many at once: ``DeadLetterLog`` (a few warnings and a summary)."""
    if attempts is not None and min_seconds is not None:
        after = f"after {attempts} failed deliveries over at least {min_seconds:g}s"
    else:
        after = "after its failed deliveries spanned the dead-letter rule"
    log.log(
        level,
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


class DeadLetterLog:
    """Logs batches of dead letters on ``log``: the first ``warn_first`` of a batch at
    WARNING (one line each, as ``log_dead_letter``), the rest at DEBUG, then one WARNING
    ``... and N more events dead-lettered in this <scope>`` when there were more.

    With ``window_seconds`` the WARNING budget is shared by the batches of that many seconds
    (a driver that dead-letters one run's batch at a time, so an outage of many runs is many
    small batches): the batch that goes over it says so in its summary, later ones log at
    DEBUG only, and the first batch of the next window first counts them in one warning. One
    instance per outbox, or one per flush; no state is shared beyond it."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        warn_first: int = WARN_FIRST,
        window_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.warn_first = warn_first
        self.window_seconds = window_seconds
        self.clock = clock
        self._window_start: float | None = None
        self._warned = 0  # warnings for single events in this window
        self._told = False  # this window's summary said that more log at DEBUG only
        self._unreported = 0  # dead letters at DEBUG that no warning counted yet

    def log_batch(
        self,
        dead: Sequence[DeadLetteredEvent],
        *,
        min_seconds: float | None = None,
        scope: str = "flush",
    ) -> None:
        """Log the dead letters ``dead`` of one flush or publish batch (``scope`` names it)."""
        if not dead:
            return
        now = self.clock()
        if self._window_start is None or now - self._window_start >= self.window_seconds:
            if self._unreported:  # the last window's dead letters past its summary
                self._summary(
                    self._unreported,
                    f"outbox: %d more event(s) dead-lettered in the last {self.window_seconds:g}s "
                    f"were logged at DEBUG only; {_WHAT_TO_DO}",
                )
            self._window_start, self._warned, self._told, self._unreported = now, 0, False, 0
        quiet = 0
        for d in dead:
            loud = self._warned < self.warn_first
            if loud:
                self._warned += 1
            else:
                quiet += 1
            log_dead_letter(
                self.log,
                event_id=d.event_id,
                seq=d.seq,
                run_id=d.run_id,
                error=d.error,
                attempts=d.attempts,
                min_seconds=min_seconds,
                level=logging.WARNING if loud else logging.DEBUG,
            )
        self._unreported += quiet
        if quiet and not self._told:
            later = (
                f"; more in the next {self.window_seconds:g}s log at DEBUG, counted after"
                if self.window_seconds > 0
                else ""
            )
            self._summary(
                self._unreported,
                f"outbox: ... and %d more event(s) dead-lettered in this {scope} (logged at "
                f"DEBUG){later}; {_WHAT_TO_DO}",
            )
            self._told = self.window_seconds > 0
            self._unreported = 0

    def _summary(self, count: int, message: str) -> None:
        self.log.warning(message, count, extra={"wfe_dead_lettered": count})
