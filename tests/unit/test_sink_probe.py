"""A user's event sink that misbehaves (hangs, raises BaseExceptions, has an unprintable or a
5 MB message, is not async) is a failed delivery with a readable one-line error, never an
exception that escapes into the flush or the worker loop (publish_to_sink, both drivers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from engine_port import Event
from engine_port._events import MAX_SINK_ERROR, publish_to_sink

EVENTS = [Event(id="e1", run_id="r1", workflow_id="w", seq=1, type="run.created", data={}, at=0.0)]


class Raising:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    async def publish(self, events: Sequence[Event]) -> None:
        self.calls += 1
        raise self.exc


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (SystemExit(3), "SystemExit: 3"),
        (GeneratorExit(), "GeneratorExit"),
        (asyncio.CancelledError("the sink's own"), "CancelledError: the sink's own"),
        (Unprintable(), "Unprintable: <Unprintable: str() raised RuntimeError>"),
        (ConnectionError("down\nsecond line"), "ConnectionError: down second line"),
    ],
    ids=["SystemExit", "GeneratorExit", "CancelledError", "unprintable", "multiline"],
)
async def test_a_raising_sink_is_a_failed_delivery(exc: BaseException, expected: str) -> None:
    sink = Raising(exc)
    assert await publish_to_sink(sink, EVENTS) == expected
    assert sink.calls == 1


async def test_a_huge_message_is_cut() -> None:
    error = await publish_to_sink(Raising(ValueError("x" * 5_000_000)), EVENTS)
    assert error is not None and error.startswith("ValueError: xxx")
    assert len(error) < MAX_SINK_ERROR + 60 and "more characters cut" in error


class Hanging:
    def __init__(self, timeout: float | None = None) -> None:
        if timeout is not None:
            self.publish_timeout = timeout

    async def publish(self, events: Sequence[Event]) -> None:
        await asyncio.Event().wait()


async def test_a_hanging_sink_times_out() -> None:
    began = time.monotonic()
    error = await publish_to_sink(Hanging(), EVENTS, timeout=0.2)
    assert error == "the event sink did not return within 0.2s (publish timed out)"
    assert time.monotonic() - began < 2


async def test_the_sink_may_set_its_own_timeout() -> None:
    began = time.monotonic()
    error = await publish_to_sink(Hanging(0.1), EVENTS)
    assert error is not None and "within 0.1s" in error
    assert time.monotonic() - began < 2


@pytest.mark.parametrize("bad", [True, 0, -1, float("nan"), float("inf"), "5"])
async def test_a_nonsense_own_timeout_is_ignored(bad: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine_port._events as events

    monkeypatch.setattr(events, "SINK_PUBLISH_TIMEOUT_S", 0.1)
    sink = Hanging()
    sink.publish_timeout = bad
    assert "within 0.1s" in (await publish_to_sink(sink, EVENTS) or "")


async def test_a_sink_raising_its_own_timeout_error_is_told_apart() -> None:
    assert await publish_to_sink(Raising(TimeoutError("upstream")), EVENTS, timeout=5) == (
        "TimeoutError: upstream"
    )


async def test_the_callers_cancellation_still_propagates() -> None:
    task = asyncio.ensure_future(publish_to_sink(Hanging(), EVENTS, timeout=30))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_plain_function_publish_delivers_once() -> None:
    got: list[Event] = []

    class Sync:
        def publish(self, events: Sequence[Event]) -> None:
            got.extend(events)

    assert await publish_to_sink(Sync(), EVENTS) is None  # type: ignore[arg-type]
    assert got == EVENTS


async def test_a_wrong_return_value_is_ignored() -> None:
    class Answers:
        async def publish(self, events: Sequence[Event]) -> int:
            return 42

    assert await publish_to_sink(Answers(), EVENTS) is None  # type: ignore[arg-type]
