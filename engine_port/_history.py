"""A journaled step as the drivers list it (``wfe show --steps``)."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["StepEntry"]


class StepEntry(BaseModel):
    """A journaled step of a stage (its result is not shown)."""

    stage: str
    name: str
    kind: str
    completed: bool
    signal: str | None = None
