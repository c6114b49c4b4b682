"""The EventSink port, an in-memory sink and a JSON-lines file sink."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ._limits import safe_error_message
from ._models import Event

__all__ = [
    "SINK_PUBLISH_TIMEOUT_S",
    "EventSink",
    "JsonlFileSink",
    "MemorySink",
    "event_id",
    "open_event_sink",
    "publish_to_sink",
    "sink_error_text",
]

SINK_PUBLISH_TIMEOUT_S = 10.0
"""How long one ``publish`` call may take before the delivery counts as failed (retried with
backoff like any refusal): a sink that hangs never holds a flush, a stage or a shutdown."""

MAX_SINK_ERROR = 1000
"""The longest sink error kept (flush result, outbox row, dead-letter WARNING)."""


def event_id(run_id: str, *parts: object) -> str:
    """A deterministic event id: a re-execution after a crash re-emits the same id."""
    raw = "\x1f".join([run_id, *map(str, parts)])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class EventSink(Protocol):
    """Receives events at least once, in per-run order. Raising marks the delivery failed,
    and so does a ``publish`` that takes longer than ``SINK_PUBLISH_TIMEOUT_S`` (10 s), or
    than the sink's own ``publish_timeout`` attribute (seconds) when it has one."""

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


class JsonlFileSink:
    """Appends events as JSON lines to a file (``O_APPEND``, so several worker processes can
    share it). ``for_run`` reads them back, deduplicated by id, in sequence order."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _append(self, events: Sequence[Event]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(e.model_dump_json() + "\n" for e in events).encode()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except PermissionError:  # a write-only file: appended to as it is
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if _torn(fd):
                # a writer died mid-line (its events were not acknowledged, so they come
                # again): start on a line of our own instead of gluing onto its fragment
                data = b"\n" + data
            view = memoryview(data)
            while view:  # os.write may write less than asked
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    async def publish(self, events: Sequence[Event]) -> None:
        if events:
            await asyncio.to_thread(self._append, events)

    @property
    def events(self) -> list[Event]:
        """Every complete line's event. A line still being appended (no newline yet) and
        the fragment a writer left when it died mid-line are skipped: their events were not
        acknowledged, so they are delivered again (at least once)."""
        if not self.path.exists():
            return []
        out: list[Event] = []
        for line in self.path.read_bytes().split(b"\n")[:-1]:
            if not line.strip():
                continue
            try:
                out.append(Event.model_validate_json(line))
            except ValueError:
                continue  # a torn write (see above)
        return out

    def for_run(self, run_id: str) -> list[Event]:
        seen: dict[str, Event] = {}
        for e in self.events:
            if e.run_id == run_id and e.id not in seen:
                seen[e.id] = e
        return sorted(seen.values(), key=lambda e: e.seq)


def _torn(fd: int) -> bool:
    """Whether the regular file ``fd`` ends inside a line (not for pipes or terminals)."""
    try:
        st = os.fstat(fd)
        return (
            stat.S_ISREG(st.st_mode) and st.st_size > 0 and os.pread(fd, 1, st.st_size - 1) != b"\n"
        )
    except OSError:
        return False


def sink_error_text(exc: BaseException) -> str:
    """A sink's failure as one readable line of at most ``MAX_SINK_ERROR`` characters, even
    when its ``__str__`` raises or its message is megabytes long."""
    text = f"{type(exc).__name__}: {safe_error_message(exc)}".rstrip(": ")
    text = " ".join(text.split())
    if len(text) > MAX_SINK_ERROR:
        text = f"{text[:MAX_SINK_ERROR]}... ({len(text) - MAX_SINK_ERROR:,} more characters cut)"
    return text


def _timeout_of(sink: EventSink) -> float:
    own = getattr(sink, "publish_timeout", None)
    if isinstance(own, int | float) and not isinstance(own, bool) and 0 < own < float("inf"):
        return float(own)
    return SINK_PUBLISH_TIMEOUT_S


async def publish_to_sink(
    sink: EventSink, events: Sequence[Event], timeout: float | None = None
) -> str | None:
    """Hand ``events`` to the user's ``sink``: None when it took them, else why not (a line
    for the outbox and the logs). Never raises for the sink: an exception (even a
    ``SystemExit``, ``GeneratorExit`` or a ``CancelledError`` of its own), a call that takes
    longer than ``timeout`` (default: the sink's ``publish_timeout`` attribute, else
    ``SINK_PUBLISH_TIMEOUT_S``) is a failed delivery. A
    cancellation of the caller still propagates. A plain (non-async) ``publish`` that returns
    is a delivery too (it ran on the event loop)."""
    limit = _timeout_of(sink) if timeout is None else timeout
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            result = sink.publish(events)
            if inspect.isawaitable(result):
                await result
    except TimeoutError as exc:
        if deadline.expired():
            return f"the event sink did not return within {limit:g}s (publish timed out)"
        return sink_error_text(exc)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the caller is cancelled (a shutdown): not the sink's doing
        return sink_error_text(exc)
    except (Exception, SystemExit, GeneratorExit) as exc:
        return sink_error_text(exc)
    return None


def open_event_sink(spec: str) -> EventSink:
    """``jsonl:///path/events.jsonl`` or ``package.module:factory`` (a sink, or a zero-argument
    callable returning one)."""
    from .errors import ConfigurationError

    if spec.startswith("jsonl://"):
        path = spec.removeprefix("jsonl://")
        if not path or Path(path).is_dir():
            # (every delivery would fail and the events end as dead letters)
            raise ConfigurationError(
                f"event_sink {spec!r} names no file; use jsonl:///PATH/events.jsonl"
            )
        return JsonlFileSink(path)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(
            f"event_sink {spec!r} must be jsonl:///PATH or 'package.module:factory'"
        )
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load event sink {spec!r}: {exc}") from None
    sink = target() if callable(target) and not hasattr(target, "publish") else target
    if not hasattr(sink, "publish"):
        raise ConfigurationError(f"event sink {spec!r} has no async publish(events) method")
    return sink  # type: ignore[no-any-return]
