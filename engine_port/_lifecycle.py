"""Lifecycle events, built one way for every driver.

Both drivers build their events through these functions, so event types, data shapes and
deterministic ids agree by construction. An id depends only on the run, its redrive count and
the position of the event in the run's life (stage, attempt, suspension number), never on time,
so a re-execution after a crash re-emits the same id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._events import event_id
from ._models import ErrorInfo, Event

__all__ = ["LIFECYCLE_EVENT_TYPES", "EventDraft", "Lifecycle", "run_output"]

# the event types the Lifecycle below emits (``ctx.emit`` refuses them as business events)
LIFECYCLE_EVENT_TYPES = frozenset(
    {
        "run.created",
        "run.started",
        "run.completed",
        "run.failed",
        "run.cancelled",
        "run.redriven",
        "run.migrated",
        "stage.started",
        "stage.suspended",
        "stage.completed",
        "stage.failed",
        "stage.cancelled",
        "stage.compensated",
    }
)


@dataclass(frozen=True)
class EventDraft:
    """An event before the driver assigns its per-run sequence number."""

    id: str
    type: str
    stage: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    business: bool = False

    def at_seq(self, run_id: str, workflow_id: str, seq: int, at: datetime) -> Event:
        return Event(
            id=self.id,
            run_id=run_id,
            seq=seq,
            type=self.type,
            workflow_id=workflow_id,
            stage=self.stage,
            data=self.data,
            business=self.business,
            at=at,
        )


class Lifecycle:
    """Event drafts for one run (``redrive`` = how many times it was redriven)."""

    def __init__(self, run_id: str, redrive: int = 0) -> None:
        self.run_id = run_id
        self.redrive = redrive

    def _id(self, *parts: object) -> str:
        return event_id(self.run_id, self.redrive, *parts)

    def run_created(self, version: str) -> EventDraft:
        return EventDraft(
            event_id(self.run_id, "run.created"), "run.created", None, {"version": version}
        )

    def run_started(self) -> EventDraft:
        return EventDraft(self._id("run.started"), "run.started")

    def stage_started(self, stage: str, attempt: int) -> EventDraft:
        return EventDraft(
            self._id("stage.started", stage, attempt), "stage.started", stage, {"attempt": attempt}
        )

    def stage_suspended(
        self,
        stage: str,
        attempt: int,
        step: str | None,
        n: int,
        reason: str,
        until: datetime | None,
        waiting_for: str,
    ) -> EventDraft:
        """A suspension is identified by the step that suspended (its journal key) and the
        time it waits until (each poll of a ``wait_for`` has its own): the same suspension
        emitted again (a crash, the replay of a Temporal reset) keeps its id, and no other
        one can take it, however many waits a replay took from the journal without
        suspending. ``step`` None (a Temporal attempt recorded before 2026-12-06): the id
        numbers the attempt's suspensions by ``n``, from 1, as it did then."""
        at = None if until is None else until.isoformat()
        data = {"reason": reason, "until": at, "waiting_for": waiting_for}
        which = (n,) if step is None else (step, at or "")
        return EventDraft(
            self._id("stage.suspended", stage, attempt, *which), "stage.suspended", stage, data
        )

    def stage_completed(self, stage: str, attempt: int) -> EventDraft:
        return EventDraft(
            self._id("stage.completed", stage, attempt),
            "stage.completed",
            stage,
            {"attempt": attempt},
        )

    def stage_failed(
        self, stage: str, attempt: int, error: ErrorInfo, will_retry: bool
    ) -> EventDraft:
        data = {
            "attempt": attempt,
            "error": {"type": error.type, "message": error.message},
            "will_retry": will_retry,
        }
        return EventDraft(self._id("stage.failed", stage, attempt), "stage.failed", stage, data)

    def stage_cancelled(self, stage: str) -> EventDraft:
        return EventDraft(self._id("stage.cancelled", stage), "stage.cancelled", stage)

    def stage_compensated(self, stage: str) -> EventDraft:
        return EventDraft(self._id("stage.compensated", stage), "stage.compensated", stage)

    def business(self, stage: str, index: int, type: str, data: dict[str, Any]) -> EventDraft:
        return EventDraft(self._id("business", stage, index), type, stage, data, business=True)

    def run_completed(self) -> EventDraft:
        return EventDraft(self._id("run.completed"), "run.completed")

    def run_failed(self, error: ErrorInfo) -> EventDraft:
        return EventDraft(
            self._id("run.failed"),
            "run.failed",
            None,
            {"error": {"type": error.type, "message": error.message, "stage": error.stage}},
        )

    def run_cancelled(self) -> EventDraft:
        return EventDraft(self._id("run.cancelled"), "run.cancelled")

    def run_redriven(self, from_: str, version: str) -> EventDraft:
        # built with the *new* redrive count
        return EventDraft(
            self._id("run.redriven"),
            "run.redriven",
            None,
            {"from": from_, "redrive": self.redrive, "version": version},
        )

    def run_migrated(self, target: str, seq: int) -> EventDraft:
        """``seq``: the event's own sequence number (a run may move away several times)."""
        return EventDraft(self._id("run.migrated", seq), "run.migrated", None, {"target": target})


def run_output(sinks: list[str], outputs: dict[str, Any]) -> Any:
    """The run's output: the sink stage's output, or ``{stage: output}`` for several sinks."""
    if len(sinks) == 1:
        return outputs.get(sinks[0])
    return {s: outputs.get(s) for s in sorted(sinks)}
