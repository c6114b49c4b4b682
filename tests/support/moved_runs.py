"""What the tests of moved runs share: an engine with the sink it publishes to, and the
checks of the events a sink holds (DESIGN §5: every event id is emitted once, with one
sequence number)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from engine_port import Event, MemorySink, WorkflowEngine

__all__ = ["Side", "check_ids", "flushed", "until"]


class Side:
    """An engine and the sink it publishes to."""

    def __init__(self, engine: WorkflowEngine, sink: MemorySink) -> None:
        self.engine, self.sink = engine, sink


async def until(what: str, probe: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def flushed(side: Side, run_id: str) -> None:
    """Every event the engine holds for the run reached its sink."""
    held = {e.id for e in await side.engine.events(run_id)}

    async def delivered() -> bool:
        await side.engine.flush_events()
        return held <= {e.id for e in side.sink.for_run(run_id)}

    await until("events delivered", delivered)


def check_ids(events: list[Event]) -> list[Event]:
    """No id delivered with two sequence numbers (or as two events); deduplicated by id, the
    run's events are numbered 1..n without a gap."""
    by_id: dict[str, tuple[Any, ...]] = {}
    for e in events:
        what = (e.seq, e.type, e.stage, e.data)
        assert by_id.setdefault(e.id, what) == what, (e.id, by_id[e.id], what)
    kept: dict[str, Event] = {}
    for e in events:
        kept.setdefault(e.id, e)
    ordered = sorted(kept.values(), key=lambda e: e.seq)
    assert [e.seq for e in ordered] == list(range(1, len(ordered) + 1)), [
        (e.seq, e.type, e.stage, e.id) for e in ordered
    ]
    return ordered
