"""Pages of a Temporal run's events (``engine.events(run_id, after_seq=, limit=)``; their
contract on every driver: tests/integration/test_event_pages.py). The events are rebuilt by
replaying the run's histories: a page loop replays the run once, not once a page, and a page
read after the run moved on (a redrive: another execution) has the new events."""

from __future__ import annotations

from typing import Any

import pytest

import driver_temporal._engine as temporal_engine
from engine_port import Event, MemorySink, Registry

from .conftest import EngineFactory, wait_for_event
from .test_history_events import order_flow

pytestmark = pytest.mark.temporal


async def _loop(engine: Any, run_id: str, limit: int, after: int | None = None) -> list[Event]:
    out: list[Event] = []
    while True:
        page: list[Event] = await engine.events(run_id, after_seq=after, limit=limit)
        out += page
        if len(page) < limit:
            return out
        after = page[-1].seq


async def test_a_page_loop_replays_the_run_once(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    replays: list[str] = []
    real = temporal_engine.run_events

    async def counted(*args: Any, **kwargs: Any) -> list[Event]:
        replays.append(args[1])
        return await real(*args, **kwargs)

    monkeypatch.setattr(temporal_engine, "run_events", counted)
    sink = MemorySink()
    engine = make_engine(Registry([order_flow({"flaky": 0, "ship": 0})]), sink=sink)
    async with engine:
        run = await engine.start("hist-events", {"n": 3})
        async with engine.worker():
            await engine.signal(run.id, "approval", {"ok": True})
            assert (await engine.wait(run.id, timeout=30)).status == "completed"
            await wait_for_event(sink, run.id, "run.completed")
        everything = await engine.events(run.id)
        await engine.events(run.id)
        assert len(replays) == 2  # (every event at once: a replay each, as before)
        assert len(everything) > 6

        assert await _loop(engine, run.id, 2) == everything
        assert len(replays) == 3, "the pages after the first were not cut from its replay"
        assert await _loop(engine, run.id, 5) == everything  # (a new loop: a new replay)
        assert len(replays) == 4
    assert everything == sink.for_run(run.id)


async def test_a_page_after_a_redrive_has_the_new_execution_s_events(
    make_engine: EngineFactory,
) -> None:
    sink = MemorySink()
    fails = {"flaky": 0, "ship": 2}
    engine = make_engine(Registry([order_flow(fails)]), sink=sink)
    async with engine:
        run = await engine.start("hist-events", {"n": 1})
        async with engine.worker():
            await engine.signal(run.id, "approval", {"ok": True})
            assert (await engine.wait(run.id, timeout=30)).status == "failed"
            await wait_for_event(sink, run.id, "run.failed")
            # a loop that stops one page short of the end keeps the replay of the failed run
            first = await engine.events(run.id, limit=3)
            fails["ship"] = 0
            await engine.redrive(run.id, from_="last_failure")
            assert (await engine.wait(run.id, timeout=30)).status == "completed"
            await wait_for_event(sink, run.id, "run.completed")
        rest = await _loop(engine, run.id, 3, after=first[-1].seq)
        everything = await engine.events(run.id)
    types = [e.type for e in rest]
    assert "run.redriven" in types and types[-1] == "run.completed", types
    assert first + rest == everything == sink.for_run(run.id)
