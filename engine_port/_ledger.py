"""The step ledger: journal of durable-step outcomes keyed by (run, stage, step name)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal, Protocol

from ._serde import JSON

__all__ = ["InMemoryLedger", "StepKind", "StepLedger", "StepRecord"]

StepKind = Literal["run", "sleep", "signal", "poll"]


@dataclass(frozen=True)
class StepRecord:
    """One journaled step. ``deadline`` is a sleep's wake time or a wait's timeout, fixed at
    the step's first execution; ``completed`` steps replay ``result``."""

    name: str
    kind: StepKind
    completed: bool
    result: JSON = None
    deadline: datetime | None = None
    signal: str | None = None

    def done(self, result: JSON) -> StepRecord:
        return replace(self, completed=True, result=result)


class StepLedger(Protocol):
    """What the StageRunner needs from a driver's journal of one stage of one run."""

    async def get(self, name: str) -> StepRecord | None: ...

    async def put(self, record: StepRecord) -> None: ...

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        """If a signal named ``record.signal`` is buffered for the run, take it and journal
        ``record`` as completed with its payload, atomically; else return None."""
        ...


class InMemoryLedger:
    """A ledger held in memory (tests, and the Temporal driver's activity side)."""

    def __init__(
        self,
        records: dict[str, StepRecord] | None = None,
        signals: dict[str, JSON] | None = None,
    ) -> None:
        self.records: dict[str, StepRecord] = dict(records or {})
        self.signals: dict[str, JSON] = dict(signals or {})
        self.consumed: list[str] = []
        self.written: list[StepRecord] = []

    async def get(self, name: str) -> StepRecord | None:
        return self.records.get(name)

    async def put(self, record: StepRecord) -> None:
        self.records[record.name] = record
        self.written.append(record)

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        assert record.signal is not None
        if record.signal not in self.signals:
            return None
        payload = self.signals.pop(record.signal)
        self.consumed.append(record.signal)
        done = record.done(payload)
        await self.put(done)
        return done
