"""A journaled step as the drivers list it (``wfe show --steps``)."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["StepEntry"]


class StepEntry(BaseModel):
    """A journaled step of a stage (its result is not shown). ``stage``: the stage id, or
    ``<stage id>#compensation`` for a step of its compensation; ``kind``: ``run``, ``sleep``,
    ``signal`` or ``poll``; ``signal``: the signal name a ``signal`` step waits for."""

    stage: str
    name: str
    kind: str
    completed: bool
    signal: str | None = None
