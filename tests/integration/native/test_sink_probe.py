"""A user's event sink that misbehaves, seen from outside on the native driver: a hanging
sink must not hold the worker loop (other runs' stages go on), must be bounded (a failed
delivery, retried with backoff) and must not hold the worker's stop; a sink raising
BaseExceptions (SystemExit, GeneratorExit, its own CancelledError) or an unprintable / huge
error is a failed delivery with a readable error, not a dead worker loop or traceback spam."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from engine_port import Event, MemorySink, RunStatus, StageContext, Workflow

from . import workflows as w
from .conftest import MakeEngine


async def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


one = Workflow("it-sink-probe", input=w.Item)


@one.stage
async def only(ctx: StageContext[w.Item]) -> int:
    ctx.emit("probe.noted", {"n": ctx.input.n})
    return ctx.input.n


FAST_RETRY = {
    "dead_letter_after": 1000,
    "outbox_retry_initial_seconds": 0.05,
    "outbox_retry_max_seconds": 0.1,
}


class HangingSink(MemorySink):
    """Every publish hangs until ``release`` is set (then delivers)."""

    def __init__(self, publish_timeout: float | None = None) -> None:
        super().__init__()
        self.release = asyncio.Event()
        if publish_timeout is not None:
            self.publish_timeout = publish_timeout

    async def publish(self, events: Sequence[Event]) -> None:
        self.attempts += 1
        await self.release.wait()
        self.events.extend(events)


async def test_a_hanging_sink_does_not_hold_the_worker(make_engine: MakeEngine) -> None:
    """Before: the worker loop awaited the flush, so one hanging publish stopped all
    claiming (later runs never ran) and ``stop()`` waited for ever."""
    sink = HangingSink()  # the default publish timeout (10 s): longer than this test waits
    eng = await make_engine(one, event_sink=sink, **FAST_RETRY)
    async with eng.worker(shutdown_timeout=0.5) as worker:
        first = await eng.start(one.id, {"n": 0})
        assert (await eng.wait(first.id, timeout=10)).status == RunStatus.COMPLETED
        await eventually(lambda: sink.attempts >= 1, what="the sink to be called")
        began = time.monotonic()
        runs = [await eng.start(one.id, {"n": i}) for i in range(1, 4)]
        for run in runs:
            assert (await eng.wait(run.id, timeout=5)).status == RunStatus.COMPLETED
        assert time.monotonic() - began < 5
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 4, "stop() waited for the hanging sink"
    assert worker.stats()["loop_errors"] == 0
    sink.release.set()
    assert (await eng.flush_events()).sink_status == "healthy"
    assert [e.type for e in sink.for_run(runs[-1].id)][-1] == "run.completed"


async def test_a_hanging_publish_is_a_failed_delivery_with_backoff(
    make_engine: MakeEngine,
) -> None:
    sink = HangingSink(publish_timeout=0.2)
    eng = await make_engine(one, event_sink=sink, **FAST_RETRY)
    run = await eng.start(one.id, {"n": 1})
    began = time.monotonic()
    result = await eng.flush_events()
    assert time.monotonic() - began < 3
    assert result.failed >= 1 and result.sink_status == "degraded"
    assert result.sink_error == "the event sink did not return within 0.2s (publish timed out)"
    counts = await eng.outbox_counts()
    assert counts.retrying >= 1
    sink.release.set()
    await eventually(eng.flush_events, what="a flush")  # (returns a truthy result)

    async def delivered() -> bool:
        await eng.flush_events()
        return bool(sink.for_run(run.id))

    await eventually(delivered, what="delivery once the sink answers")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class RaisingSink(MemorySink):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    async def publish(self, events: Sequence[Event]) -> None:
        self.attempts += 1
        if self.failing:
            raise self.exc
        self.events.extend(events)


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (SystemExit(3), "SystemExit: 3"),
        (GeneratorExit(), "GeneratorExit"),
        (asyncio.CancelledError("mine"), "CancelledError: mine"),
        (Unprintable(), "Unprintable: <Unprintable: str() raised RuntimeError>"),
        (ValueError("x" * 5_000_000), "ValueError: xxxx"),
    ],
    ids=["SystemExit", "GeneratorExit", "CancelledError", "unprintable", "5MB"],
)
async def test_a_sink_raising_anything_is_a_failed_delivery(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture, exc: BaseException, error: str
) -> None:
    """Before: SystemExit ended the process, GeneratorExit and CancelledError ended the
    worker loop silently (no later run ran), an unprintable error failed every flush with
    two tracebacks per loop, and a 5 MB message went whole into each WARNING."""
    caplog.set_level(logging.INFO)
    sink = RaisingSink(exc)
    sink.failing = True
    eng = await make_engine(
        one,
        event_sink=sink,
        **{**FAST_RETRY, "dead_letter_after": 2},
        outbox_dead_letter_min_seconds=0,
    )
    async with eng.worker() as worker:
        first = await eng.start(one.id, {"n": 1})
        assert (await eng.wait(first.id, timeout=10)).status == RunStatus.COMPLETED
        await eventually(lambda: worker.stats()["dead_lettered"] >= 1, what="a dead letter")
        later = await eng.start(one.id, {"n": 2})  # the worker loop still claims
        assert (await eng.wait(later.id, timeout=10)).status == RunStatus.COMPLETED
        assert worker.stats()["loop_errors"] == 0
    # (a flush of our own, of the events the worker's flushes dead-lettered: beside the
    # worker, its flush could take them first and leave this one nothing to deliver)
    await eng.replay_dlq()
    result = await eng.flush_events()
    assert result.sink_status == "degraded"
    assert result.sink_error is not None and result.sink_error.startswith(error)
    assert len(result.sink_error) < 1100
    assert "Traceback" not in caplog.text
    assert len(caplog.text) < 50_000
    warned = [r for r in caplog.records if r.name == "wfe.outbox"]
    assert warned and all(
        error in r.getMessage() for r in warned if "last sink error" in r.getMessage()
    )
    sink.failing = False
    await eng.replay_dlq()

    async def delivered() -> bool:
        await eng.flush_events()
        return any(e.type == "run.completed" for e in sink.for_run(later.id))

    await eventually(delivered, what="delivery after the sink recovers")


async def test_a_plain_function_publish_delivers_once(make_engine: MakeEngine) -> None:
    """Before: the events reached the sink, then ``await None`` failed the delivery, so they
    were delivered again and again and finally dead-lettered."""
    got: list[Event] = []

    class SyncSink:
        def publish(self, events: Sequence[Event]) -> None:
            got.extend(events)

    eng = await make_engine(one, event_sink=SyncSink(), **FAST_RETRY)
    run = await eng.start(one.id, {"n": 1})
    async with eng.worker():
        assert (await eng.wait(run.id, timeout=10)).status == RunStatus.COMPLETED
    result = await eng.flush_events()
    assert result.sink_status == "healthy" and result.failed == 0
    ids = [e.id for e in got if e.run_id == run.id]
    assert len(ids) == len(set(ids)) == 6


async def test_a_sink_that_mutates_or_keeps_event_data_changes_nothing_stored(
    make_engine: MakeEngine,
) -> None:
    kept: list[dict[str, object]] = []

    class Meddling:
        async def publish(self, events: Sequence[Event]) -> None:
            for e in events:
                e.data["meddled"] = True
                kept.append(e.data)

    eng = await make_engine(one, event_sink=Meddling(), **FAST_RETRY)
    run = await eng.start(one.id, {"n": 7})
    async with eng.worker():
        assert (await eng.wait(run.id, timeout=10)).status == RunStatus.COMPLETED
    await eng.flush_events()
    for data in kept:
        data["later"] = 1
    stored = await eng.events(run.id)
    assert [e.data for e in stored if e.type == "probe.noted"] == [{"n": 7}]
    assert all("meddled" not in e.data and "later" not in e.data for e in stored)
