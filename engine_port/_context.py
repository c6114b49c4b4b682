"""StageContext and the durable-step API available inside a stage body."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import ValidationError

from ._graph import Stage, _return_type
from ._ledger import StepLedger, StepRecord
from ._lifecycle import LIFECYCLE_EVENT_TYPES
from ._limits import (
    check_event_type,
    check_json,
    check_signal_name,
    check_step_name,
)
from ._payload_limit import check_payload_size
from ._serde import JSON, json_copy, to_json_value, validate_as
from ._telemetry import step_span
from .errors import SerializationError, StepError, StepTimeoutError

if TYPE_CHECKING:
    from ._clock import Clock
    from ._graph import Workflow
    from ._registry import Registry

__all__ = ["StageContext", "Steps", "SyncSteps"]

InT = TypeVar("InT")
T = TypeVar("T")


class Suspend(BaseException):
    """Raised out of a stage body to suspend it; a BaseException so ``except Exception``
    in user code cannot swallow it."""

    def __init__(
        self,
        reason: Literal["sleep", "signal", "poll"],
        until: datetime | None,
        waiting_for: str,
        step: str,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.until = until
        self.waiting_for = waiting_for
        self.step = step  # (the key the suspending step is journaled under)


@dataclass
class BusinessEvent:
    type: str
    data: dict[str, Any]


# The business events staged while a step's function runs (``ctx.emit`` in it, or in a hook
# handler): journaled with the step, and staged again when a replay returns its result
# instead of running it (a later suspension replays the body; without them they were lost).
_STEP_EVENTS: contextvars.ContextVar[list[BusinessEvent] | None] = contextvars.ContextVar(
    "wfe_step_events", default=None
)


def _events_meta(events: list[BusinessEvent]) -> dict[str, JSON]:
    return {"events": [{"type": e.type, "data": e.data} for e in events]} if events else {}


def _stage(events: list[BusinessEvent], event: BusinessEvent) -> None:
    """Stage ``event`` in the stage's ``events``, and note it for the step running it."""
    events.append(event)
    mine = _STEP_EVENTS.get()
    if mine is not None:
        mine.append(event)


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


class Steps:
    """Durable steps: each outcome is journaled; a replay returns the recorded result."""

    def __init__(
        self,
        ledger: StepLedger,
        clock: Clock,
        declared: Callable[[], set[str]] | None = None,
        events: list[BusinessEvent] | None = None,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._declared = declared  # the signal names the workflow declares (engine.signal's)
        self._used: set[str] = set()
        self._signal_waits: dict[str, int] = {}
        # the stage's staged business events (the StageContext's ``events``)
        self._events: list[BusinessEvent] = [] if events is None else events
        self._closed = False

    def close(self) -> None:
        """End the attempt for these steps: a context that leaked out of the stage body (a
        task the body started and did not await) gets a StepError from any later step or
        ``ctx.emit``, instead of journaling into an attempt that is over (lost, or refused
        by the driver with an engine-internal error)."""
        self._closed = True

    def _open(self, what: str) -> None:
        if self._closed:
            raise StepError(
                f"{what} was called after its stage attempt ended (the body had returned or "
                "raised); steps, events and hooks belong inside the stage body: await the "
                "tasks the body starts before it returns"
            )

    def _replayed(self, rec: StepRecord) -> None:
        """A completed step returns its result without running: stage again the business
        events its function staged when it ran."""
        for e in (rec.meta or {}).get("events") or []:
            assert isinstance(e, dict)
            _stage(self._events, BusinessEvent(str(e["type"]), dict(e["data"])))

    async def _staging(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, dict[str, JSON]]:
        """``fn(*args)`` with the business events it stages noted: (its value, the meta
        that journals them)."""
        mine: list[BusinessEvent] = []
        token = _STEP_EVENTS.set(mine)
        try:
            value = await _call(fn, *args)
        finally:
            _STEP_EVENTS.reset(token)
        return value, _events_meta(mine)

    def _claim(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise StepError("a step needs a non-empty string name")
        if name in self._used:
            raise StepError(
                f"step name {name!r} is used twice in this stage; give every step in a stage "
                "its own name"
            )
        self._used.add(name)

    def run(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, Any]:
        """Run ``fn(*args, **kwargs)`` once; later replays return its journaled result.

        ``name`` and ``fn`` are positional-only, so ``fn`` may take keyword arguments called
        ``name`` or ``fn`` (they were a TypeError inside the stage, retried)."""
        _on_loop("ctx.step.run", "ctx.sync_step.run")
        return self._run_step(name, fn, *args, **kwargs)

    async def _run_step(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        self._open(f"step {name!r}")
        self._claim(name)
        check_step_name(name)  # before fn runs: a name no backend can journal fails at once
        if not callable(fn):
            if inspect.iscoroutine(fn):
                fn.close()  # (never awaited: no "coroutine was never awaited" warning)
            raise StepError(
                f"step {name!r}: ctx.step.run takes the function and its arguments, got "
                f"{type(fn).__name__}; write ctx.step.run({name!r}, f, x), not f(x)"
            )
        return await self._run(name, fn, *args, **kwargs)

    async def _run(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``run`` without the user step-name limit (hook steps compose longer keys)."""
        self._open(f"step {name!r}")
        out_type = _return_type(fn)
        rec = await self._ledger.get(name)
        if rec is not None and rec.completed:
            self._replayed(rec)
            return _step_result(out_type, rec.result, name)
        with step_span(name):
            result, meta = await self._staging(functools.partial(fn, *args, **kwargs))
        value = to_json_value(result, f"result of step {name!r}")
        check_json(value, f"result of step {name!r}")  # before it is journaled
        await self._ledger.put(
            StepRecord(name=name, kind="run", completed=True, result=value, meta=meta)
        )
        return _step_result(out_type, value, name)

    def sleep(self, name: str, duration: timedelta | float) -> Coroutine[Any, Any, None]:
        """A durable sleep: the stage suspends and resumes once ``duration`` has passed."""
        _on_loop("ctx.step.sleep", "ctx.sync_step.sleep")
        return self._sleep(name, duration)

    async def _sleep(self, name: str, duration: timedelta | float) -> None:
        self._open(f"sleep {name!r}")
        self._claim(name)
        check_step_name(name)
        now = self._clock.now()
        deadline = _later(now, duration, f"sleep {name!r}: the duration")
        rec = await self._ledger.get(name)
        if rec is None:
            rec = StepRecord(name=name, kind="sleep", completed=False, deadline=deadline)
            if deadline > now:
                await self._ledger.put(rec)
        if rec.completed:
            return
        assert rec.deadline is not None
        if now >= rec.deadline:
            await self._ledger.put(rec.done(None))
            return
        raise Suspend("sleep", rec.deadline, f"sleep:{name}", name)

    def wait_for_signal(
        self, name: str, timeout: timedelta | float | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Wait for ``engine.signal(run, name, payload)`` and return the payload.

        Signals of one name queue per run in arrival order; each wait takes the next one (a
        signal sent earlier was buffered and is taken here without suspending). With
        ``timeout``, the deadline is fixed on the first execution; past it the body receives
        :class:`StepTimeoutError`. A wait with no buffered signal always suspends once (a
        ``stage.suspended`` event), however short its timeout.

        A stage body may wait for one name several times: the k-th wait for ``name`` in the
        body is journaled under the step key ``name`` for k=1 and ``name#k`` for k>=2 (the
        body replays from the top, so the numbering is the same on every replay). Do not
        give another step of the stage one of those keys.
        """
        _on_loop("ctx.step.wait_for_signal", "ctx.sync_step.wait_for_signal")
        return self._wait_for_signal(name, timeout)

    async def _wait_for_signal(self, name: str, timeout: timedelta | float | None) -> Any:
        self._open(f"signal wait {name!r}")
        if not isinstance(name, str) or not name:
            raise StepError("a signal wait needs a non-empty string name")
        check_signal_name(name)
        known = set() if self._declared is None else self._declared()
        if known and name not in known:
            # engine.signal refuses the name (UnknownSignalError): the wait could never end
            raise StepError(
                f"the stage waits for signal {name!r}, which no stage of its workflow declares "
                f"(declared: {', '.join(sorted(known))}), so engine.signal refuses it; add it to "
                "the stage's signals=[...]"
            )
        k = self._signal_waits.get(name, 0) + 1
        self._signal_waits[name] = k
        key = name if k == 1 else f"{name}#{k}"
        self._claim(key)
        return await self._signal_step(key, name, timeout)

    async def _signal_step(
        self, key: str, name: str, timeout: timedelta | float | None, *, gate: bool = False
    ) -> Any:
        """The signal wait journaled as ``key``: its payload, StepTimeoutError once its
        deadline passed, or Suspend. ``gate``: the wait of ``after_signal``, which journals
        nothing while it waits when it has no deadline to keep."""
        now = self._clock.now()
        deadline = (
            None if timeout is None else _later(now, timeout, f"signal wait {name!r}: timeout")
        )
        rec = await self._ledger.get(key)
        if rec is not None and rec.completed:
            if rec.timed_out:
                raise _signal_timeout(name, rec)
            return json_copy(rec.result)
        if rec is None:
            rec = StepRecord(
                name=key, kind="signal", completed=False, deadline=deadline, signal=name
            )
            taken = await self._ledger.consume_signal(rec)
            if taken is not None:
                return json_copy(taken.result)
            if not gate or deadline is not None:
                await self._ledger.put(rec)
            # a new wait always suspends once, even if its deadline passed meanwhile (a slow
            # ledger write on a busy machine): the trace must not depend on timing
            raise Suspend("signal", rec.deadline, f"signal:{name}", key)
        else:
            taken = await self._ledger.consume_signal(rec)
            if taken is not None:
                return json_copy(taken.result)
        if rec.deadline is not None and self._clock.now() >= rec.deadline:
            await self._ledger.put(rec.done(None, timeout=rec.deadline.isoformat()))
            raise _signal_timeout(name, rec)
        raise Suspend("signal", rec.deadline, f"signal:{name}", key)

    async def _gate(self, name: str, timeout: timedelta | None = None) -> None:
        """The wait of a stage declared ``after_signal=name``, before its body runs: the
        oldest buffered ``name`` signal is journaled as the step ``name`` (the body's first
        ``wait_for_signal(name)`` returns it at once). With none buffered the attempt
        suspends; without a ``timeout`` it journals nothing (no deadline to keep), so a
        driver may wait for the signal without running the attempt at all (the Temporal
        driver waits in the workflow: no activity until the signal is there). With one it
        is ``wait_for_signal(name, timeout=)``: the deadline journaled at the first wait,
        StepTimeoutError once it passed (journaled: every later attempt fails at once)."""
        await self._signal_step(name, name, timeout, gate=True)

    def wait_for(
        self,
        name: str,
        check: Callable[[], Any],
        interval: timedelta | float = 1.0,
        timeout: timedelta | float | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Poll ``check()`` every ``interval`` until it returns something other than None or
        False; that value is journaled and returned."""
        _on_loop("ctx.step.wait_for", "ctx.sync_step.wait_for")
        return self._wait_for(name, check, interval, timeout)

    async def _wait_for(
        self,
        name: str,
        check: Callable[[], Any],
        interval: timedelta | float,
        timeout: timedelta | float | None,
    ) -> Any:
        self._open(f"wait_for {name!r}")
        self._claim(name)
        check_step_name(name)
        now = self._clock.now()
        what = f"wait_for {name!r}"
        deadline = None if timeout is None else _later(now, timeout, f"{what}: timeout")
        _later(now, interval, f"{what}: interval", positive=True)
        rec = await self._ledger.get(name)
        if rec is not None and rec.completed:
            if rec.timed_out:
                raise _poll_timeout(name, rec)
            self._replayed(rec)
            return json_copy(rec.result)
        if rec is None:
            rec = StepRecord(name=name, kind="poll", completed=False, deadline=deadline)
            await self._ledger.put(rec)
        value, meta = await self._staging(check)
        if value is not None and value is not False:
            result = to_json_value(value, f"result of wait_for step {name!r}")
            check_json(result, f"result of wait_for step {name!r}")
            await self._ledger.put(rec.done(result, **meta))
            return json_copy(result)
        now = self._clock.now()
        if rec.deadline is not None and now >= rec.deadline:
            await self._ledger.put(rec.done(None, timeout=rec.deadline.isoformat()))
            raise _poll_timeout(name, rec)
        until = now + _td(interval)
        if rec.deadline is not None:
            until = min(until, rec.deadline)
        raise Suspend("poll", until, f"poll:{name}", name)


def _signal_timeout(name: str, rec: StepRecord) -> StepTimeoutError:
    when = "its deadline" if rec.deadline is None else rec.deadline.isoformat()
    return StepTimeoutError(
        f"no signal {name!r} arrived before {when}; catch StepTimeoutError to handle the "
        "timeout, or send the signal earlier"
    )


def _poll_timeout(name: str, rec: StepRecord) -> StepTimeoutError:
    when = "its deadline" if rec.deadline is None else rec.deadline.isoformat()
    return StepTimeoutError(
        f"condition {name!r} was not met before {when}; catch StepTimeoutError to handle the "
        "timeout"
    )


def _td(value: timedelta | float) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=float(value))


def _later(now: datetime, value: Any, what: str, *, positive: bool = False) -> datetime:
    """``now`` plus the duration ``value`` (a timedelta or a number of seconds), checked before
    anything is journaled: text, NaN, infinity and a time past the year 9999 were a
    ``ValueError`` or ``OverflowError`` from inside the step (retried as the body's own
    error), and text was read as seconds. ``positive``: more than zero (a poll interval of
    0 polls without a pause)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    seconds = value.total_seconds() if isinstance(value, timedelta) else value if number else None
    if seconds is None or not math.isfinite(seconds) or (positive and seconds <= 0):
        kind = "more than 0 seconds" if positive else "a finite number of seconds"
        raise StepError(f"{what} must be a timedelta or {kind}, got {value!r}")
    try:
        return now + timedelta(seconds=seconds)
    except OverflowError:
        raise StepError(f"{what} {value!r} ends after the year 9999; give a shorter one") from None


def _step_result(out_type: Any, value: JSON, name: str) -> Any:
    """A step's journaled result as its function's return annotation: one that does not match
    is a SerializationError (never retried: each retry would replay the same journaled
    result and fail the same way; a pydantic ValidationError was retried until the attempts
    ran out)."""
    try:
        return validate_as(out_type, json_copy(value))
    except ValidationError as exc:
        first = exc.errors()[0]["msg"] if exc.errors() else str(exc)
        raise SerializationError(
            f"result of step {name!r} does not match its return annotation ({first}); it is "
            "journaled, so a retry would replay it: make the step return what it declares (or "
            "fix the annotation), then redrive the run (a redrive runs its steps again)"
        ) from None


def _on_loop(what: str, blocking: str) -> None:
    """Refuse an awaitable step called off the event loop: in a sync ``def`` stage (or a sync
    step function), which runs in a thread, the coroutine it returns was never awaited, so
    the step silently never ran (only a RuntimeWarning), or the body failed on the coroutine
    it got instead of the result."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise StepError(
            f"{what} was called in a sync def stage or compensation (or a sync function in its "
            f"thread), where its awaitable never runs; use the blocking form {blocking}(...) "
            "there, or make the stage async def and await it"
        ) from None


def _run_on_loop(loop: asyncio.AbstractEventLoop, coro: Any, what: str) -> Any:
    """Run ``coro`` on ``loop`` from a worker thread and wait for it. Called on the loop's own
    thread this would block forever, so it fails with StepError instead."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise StepError(
            f"{what} blocks and only works in a sync def stage; in an async def stage use the "
            "awaitable form (await ctx.step.... / await ctx.hook(...))"
        )
    result = asyncio.run_coroutine_threadsafe(_no_exit_on_loop(coro), loop).result()
    if isinstance(result, _Exited):
        raise result.exc  # in the body's thread, where the runner fails the attempt with it
    return result


@dataclass(frozen=True)
class _Exited:
    """A ``SystemExit`` that user code (a step function, a hook handler, a ``wait_for``
    check) raised in a coroutine :func:`_run_on_loop` runs for a sync body's thread."""

    exc: SystemExit


async def _no_exit_on_loop(coro: Any) -> Any:
    """``await coro`` in a task of the engine's loop, its ``SystemExit`` handed back to the
    sync body's thread instead: a task that raises ``SystemExit`` stops the event loop (the
    worker's: every run it held stayed running until its lease or heartbeat expired)."""
    try:
        return await coro
    except SystemExit as exc:
        return _Exited(exc)


class SyncSteps:
    """The same steps for a sync ``def`` stage body (which runs in a worker thread)."""

    def __init__(self, steps: Steps, loop: asyncio.AbstractEventLoop) -> None:
        self._steps = steps
        self._loop = loop

    def _wait(self, coro: Any) -> Any:
        return _run_on_loop(self._loop, coro, "ctx.sync_step")

    def run(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self._wait(self._steps._run_step(name, fn, *args, **kwargs))

    def sleep(self, name: str, duration: timedelta | float) -> None:
        self._wait(self._steps._sleep(name, duration))

    def wait_for_signal(self, name: str, timeout: timedelta | float | None = None) -> Any:
        return self._wait(self._steps._wait_for_signal(name, timeout))

    def wait_for(
        self,
        name: str,
        check: Callable[[], Any],
        interval: timedelta | float = 1.0,
        timeout: timedelta | float | None = None,
    ) -> Any:
        return self._wait(self._steps._wait_for(name, check, interval, timeout))


@dataclass
class StageContext(Generic[InT]):
    """What a stage body receives."""

    input: InT
    run_id: str
    stage_id: str
    attempt: int
    workflow: Workflow[Any]
    step: Steps
    registry: Registry
    outputs: Mapping[str, JSON] = field(default_factory=dict)
    cancel_event: asyncio.Event | None = None
    log: logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.LoggerAdapter(logging.getLogger("wfe.stage.user"), {})
    )
    """A logger bound to this run, stage and attempt (logger ``wfe.stage.user``): messages
    carry the ids in their text and as ``extra`` fields (``wfe_run_id``, ``wfe_workflow``,
    ``wfe_stage``, ``wfe_attempt``)."""
    events: list[BusinessEvent] = field(default_factory=list)
    max_payload_bytes: int | None = None
    """The bound on one event's data (``max_payload_bytes``; the stage runner sets it): an
    event over it is refused by ``emit`` with PayloadTooLargeError, as a step result is."""
    _loop: asyncio.AbstractEventLoop | None = None
    _hook_calls: dict[str, int] = field(default_factory=dict)

    @property
    def workflow_id(self) -> str:
        return self.workflow.id

    @property
    def cancelled(self) -> bool:
        return self.cancel_event is not None and self.cancel_event.is_set()

    @property
    def sync_step(self) -> SyncSteps:
        """Blocking durable steps for sync ``def`` stage bodies."""
        if self._loop is None:
            raise StepError("sync_step is only available while a stage runs")
        return SyncSteps(self.step, self._loop)

    def output_of(self, stage: Stage | str) -> Any:
        """The output of an upstream stage, validated into that stage's output type."""
        stage_id = stage.id if isinstance(stage, Stage) else stage
        if stage_id not in self.outputs:
            raise StepError(
                f"stage {self.stage_id!r} has no output of {stage_id!r}; only completed "
                "upstream stages (listed in after=, directly or transitively) can be read"
            )
        # (a copy: the value is the driver's, shared with the other stages it hands it to)
        out_type = self.workflow.get_stage(stage_id).output_type
        return validate_as(out_type, json_copy(self.outputs[stage_id]))

    def emit(self, type: str, data: Any = None) -> None:
        """Stage a business event; it is released only when the run completes."""
        self.step._open(f"ctx.emit({type!r})")
        if not isinstance(type, str) or not type:
            raise StepError("ctx.emit needs a non-empty event type")
        check_event_type(type)
        if type in LIFECYCLE_EVENT_TYPES:
            # the sink would carry two events of that type (the business one after the
            # engine's), and a consumer acting on e.g. "run.failed" would act on a run that
            # completed
            raise StepError(
                f"ctx.emit({type!r}): {type!r} is a lifecycle event type the engine emits "
                "itself; give the business event a name of your own (e.g. 'order.completed')"
            )
        value = to_json_value(data if data is not None else {}, f"data of event {type!r}")
        check_json(value, f"data of event {type!r}")
        if not isinstance(value, dict):
            value = {"value": value}
        # (before it is staged: an event is journaled with its step and kept in the outbox
        # until the run ends, so one over the bound every other user value has was stored)
        check_payload_size(value, f"data of event {type!r}", self.max_payload_bytes)
        _stage(self.events, BusinessEvent(type, value))

    def hook(self, name: str, payload: Any = None) -> Coroutine[Any, Any, list[Any]]:
        """Run every handler registered for hook point ``name`` as a durable step, in
        registration order; returns their results."""
        _on_loop("ctx.hook", "ctx.hook_sync")
        return self._hook(name, payload)

    async def _hook(self, name: str, payload: Any) -> list[Any]:
        self.step._open(f"ctx.hook({name!r})")
        if name not in self.workflow.hooks:
            raise StepError(
                f"workflow {self.workflow.id!r} does not declare hook point {name!r}; add it "
                "with Workflow(..., hooks=[...]) or workflow.hook_point(name)"
            )
        n = self._hook_calls.get(name, 0)
        self._hook_calls[name] = n + 1
        results = []
        for h in self.registry.hook_handlers(name):
            step_name = f"hook:{name}:{n}:{h.name}"
            self.step._claim(step_name)
            results.append(await self.step._run(step_name, h.fn, self, payload))
        return results

    def hook_sync(self, name: str, payload: Any = None) -> list[Any]:
        if self._loop is None:
            raise StepError("hook_sync is only available while a stage runs")
        results: list[Any] = _run_on_loop(self._loop, self._hook(name, payload), "ctx.hook_sync")
        return results
