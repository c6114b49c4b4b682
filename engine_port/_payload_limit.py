"""The one size check for user values (``max_payload_bytes``): run inputs, signal payloads,
step results and stage outputs above the limit are refused before anything is written.

The size is that of the value's canonical JSON (what the engine stores or spills), so the
limit means the same on every driver and every store.
"""

from __future__ import annotations

from ._ledger import StepLedger, StepRecord
from ._serde import JSON, dumps
from .errors import PayloadTooLargeError

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "SizeCheckedLedger", "check_payload_size"]

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


def check_payload_size(value: JSON, what: str, limit: int | None) -> None:
    """Raise PayloadTooLargeError (an InvalidInputError) when ``value`` serializes to more
    than ``limit`` bytes."""
    if limit is None:
        return
    size = len(dumps(value))
    if size > limit:
        raise PayloadTooLargeError(what, size, limit)


class SizeCheckedLedger:
    """A StepLedger that refuses to journal a step result over the limit."""

    def __init__(self, inner: StepLedger, limit: int | None) -> None:
        self.inner = inner
        self.limit = limit

    async def get(self, name: str) -> StepRecord | None:
        return await self.inner.get(name)

    async def put(self, record: StepRecord) -> None:
        if record.completed:
            check_payload_size(record.result, f"result of step {record.name!r}", self.limit)
        await self.inner.put(record)

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        return await self.inner.consume_signal(record)
