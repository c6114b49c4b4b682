"""The step ledger: journal of durable-step outcomes keyed by (run, stage, step name)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, Protocol

from ._serde import JSON

__all__ = ["InMemoryLedger", "StepKind", "StepLedger", "StepRecord"]

StepKind = Literal["run", "sleep", "signal", "poll"]

# A timed-out wait is journaled as completed with ``meta={"timeout": deadline}``, so a replay
# raises StepTimeoutError again even if the signal (or the condition) turns up later. Before
# ``meta``, its result was ``{TIMEOUT_MARKER: deadline}``: read so only in records of then
# (``meta`` None), as any JSON, this one too, may be a signal payload or a wait's value.
TIMEOUT_MARKER = "$wfe_step_timeout"


@dataclass(frozen=True)
class StepRecord:
    """One journaled step. ``deadline`` is a sleep's wake time or a wait's timeout, fixed at
    the step's first execution; ``completed`` steps replay ``result``.

    ``meta`` is the engine's own note about the step, kept apart from ``result`` (the user's
    value, any JSON at all): ``{"timeout": iso}`` for a wait that timed out, ``{"events":
    [{"type", "data"}, ...]}`` for the business events a step's function staged (replayed
    with its result). ``None``: journaled before ``meta`` existed (a timeout then was the
    result ``{"$wfe_step_timeout": iso}``)."""

    name: str
    kind: StepKind
    completed: bool
    result: JSON = None
    deadline: datetime | None = None
    signal: str | None = None
    meta: dict[str, JSON] | None = field(default_factory=dict)

    def done(self, result: JSON, **meta: JSON) -> StepRecord:
        """The step completed now, with ``result`` and the engine's ``meta`` about it."""
        return replace(self, completed=True, result=result, meta=meta)

    def loaded(self, result: JSON) -> StepRecord:
        """The same record with its result read back (a spilled result opened)."""
        return replace(self, result=result)

    @property
    def timed_out(self) -> bool:
        """A completed wait that ended at its deadline (journaled so: a replay raises
        StepTimeoutError again even if the signal or the condition turns up later)."""
        if self.meta is not None:
            return "timeout" in self.meta
        r = self.result  # (journaled before ``meta``: ``{TIMEOUT_MARKER: deadline}``)
        return isinstance(r, dict) and len(r) == 1 and TIMEOUT_MARKER in r

    @property
    def took_signal(self) -> bool:
        """A signal wait that took a signal (completed, not at its deadline)."""
        return self.kind == "signal" and self.completed and not self.timed_out


class StepLedger(Protocol):
    """What the StageRunner needs from a driver's journal of one stage of one run."""

    async def get(self, name: str) -> StepRecord | None: ...

    async def put(self, record: StepRecord) -> None: ...

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        """If a signal named ``record.signal`` is buffered for the run, take the oldest one
        (signals of one name queue in arrival order) and journal ``record`` as completed with
        its payload, atomically; else return None."""
        ...


class InMemoryLedger:
    """A ledger held in memory (tests, and the Temporal driver's activity side).

    ``signals`` maps a signal name to its queue of buffered payloads, oldest first;
    :meth:`push` appends one. ``consumed`` lists the name of every signal taken, one entry per
    signal, in the order they were taken."""

    def __init__(
        self,
        records: dict[str, StepRecord] | None = None,
        signals: Mapping[str, Iterable[JSON]] | None = None,
    ) -> None:
        self.records: dict[str, StepRecord] = dict(records or {})
        self.signals: dict[str, list[JSON]] = {
            name: list(queue) for name, queue in (signals or {}).items()
        }
        self.consumed: list[str] = []
        self.written: list[StepRecord] = []

    def push(self, name: str, payload: JSON) -> None:
        """Buffer a signal behind the ones of its name already queued."""
        self.signals.setdefault(name, []).append(payload)

    async def get(self, name: str) -> StepRecord | None:
        return self.records.get(name)

    async def put(self, record: StepRecord) -> None:
        self.records[record.name] = record
        self.written.append(record)

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        assert record.signal is not None
        queue = self.signals.get(record.signal)
        if not queue:
            return None
        payload = queue.pop(0)
        if not queue:
            del self.signals[record.signal]
        self.consumed.append(record.signal)
        done = record.done(payload)
        await self.put(done)
        return done
