"""The EventSink port and an in-memory sink."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from ._models import Event

__all__ = ["EventSink", "MemorySink", "event_id"]


def event_id(run_id: str, *parts: object) -> str:
    """A deterministic event id: a re-execution after a crash re-emits the same id."""
    raw = "\x1f".join([run_id, *(str(p) for p in parts)])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class EventSink(Protocol):
    """Receives events at least once, in per-run order. Raising marks the delivery failed."""

    async def publish(self, events: Sequence[Event]) -> None: ...


class MemorySink:
    """Keeps every delivered event; ``failing = True`` makes deliveries fail (for tests)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.failing = False
        self.attempts = 0

    async def publish(self, events: Sequence[Event]) -> None:
        self.attempts += 1
        if self.failing:
            raise ConnectionError("event sink unavailable")
        self.events.extend(events)

    def for_run(self, run_id: str) -> list[Event]:
        """Events of one run, deduplicated by id, in sequence order."""
        seen: dict[str, Event] = {}
        for e in self.events:
            if e.run_id == run_id and e.id not in seen:
                seen[e.id] = e
        return sorted(seen.values(), key=lambda e: e.seq)
