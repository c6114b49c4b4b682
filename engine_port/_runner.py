"""The StageRunner: executes one stage attempt against a step ledger.

Both drivers call it (the native kernel from ``job.execute``, the Temporal driver from its
stage activity), which is what makes them behave identically by construction.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from ._clock import Clock, SystemClock
from ._context import BusinessEvent, StageContext, Steps, Suspend
from ._faults import GuardedLedger, InfrastructureFault
from ._graph import Stage, Workflow
from ._ledger import StepLedger
from ._limits import check_json, safe_error_message
from ._models import ErrorInfo
from ._payload_limit import DEFAULT_MAX_PAYLOAD_BYTES, SizeCheckedLedger, check_payload_size
from ._registry import Registry
from ._serde import JSON, dumps, json_copy, to_json_value, validate_as
from ._settings import EngineSettings
from ._stage_log import StageLog
from ._sync_executor import SyncStageExecutor
from ._telemetry import SpanHandle, attributes, span
from ._tracebacks import format_user_traceback
from .errors import (
    DefinitionError,
    InvalidInputError,
    PayloadTooLargeError,
    SerializationError,
    SpilledPayloadUnavailableError,
    StageExitError,
    StageTimeoutError,
    StepError,
)

__all__ = [
    "Abandoned",
    "AbandonedAttempts",
    "Completed",
    "Failed",
    "Outcome",
    "StageRequest",
    "StageRunner",
    "Suspended",
]

if TYPE_CHECKING:
    from ._metrics import EngineMetrics

log = logging.getLogger("wfe.runner")

DEFAULT_SYNC_STAGE_THREADS = 16
"""Threads for sync (non-async) stage bodies per engine (``sync_stage_threads``)."""

CANCEL_GRACE_S = 5.0
"""How long a cancelled stage body (or compensation) may take to stop before the engine stops
waiting for it, so a body that ignores cancellation cannot hang a worker's shutdown."""


@dataclass(frozen=True)
class StageRequest:
    """One stage attempt to execute. ``resumed``: the stage has journaled steps from an
    earlier execution of this attempt (it suspended, or its worker died): for logs only."""

    run_id: str
    workflow: Workflow[Any]
    stage_id: str
    attempt: int
    input: JSON
    outputs: Mapping[str, JSON] = field(default_factory=dict)
    cancel_event: asyncio.Event | None = None
    resumed: bool = False
    trace_context: str | None = None
    """The W3C ``traceparent`` stored with the run (its ``wfe.run`` span): the attempt's span
    is its child."""
    version: str | None = None
    """The run's definition version, when the driver knows it (else ``workflow.version``,
    which checks the whole definition: per attempt, that grows with the graph)."""


@dataclass(frozen=True)
class Completed:
    output: JSON
    events: tuple[BusinessEvent, ...] = ()


@dataclass(frozen=True)
class Suspended:
    reason: Literal["sleep", "signal", "poll"]
    until: datetime | None
    waiting_for: str
    step: str
    """The key of the step that suspended (``go#2`` for a body's second wait for ``go``)."""


@dataclass(frozen=True)
class Failed:
    error: ErrorInfo
    retryable: bool


@dataclass(frozen=True)
class Abandoned:
    """The engine's own storage failed while the attempt ran (DESIGN §5): the driver treats
    the attempt as crashed: no ``stage.failed``, the attempt number is kept, and it runs again
    after a backoff, replaying its journaled steps. ``reason`` names the fault (never SQL text
    or parameters): for logs only."""

    reason: str


Outcome = Completed | Suspended | Failed | Abandoned


class AbandonedAttempts:
    """How a host logs attempts abandoned on a fault of the engine's storage (DESIGN §5): an
    outage of the blob store or a full disk lets jobs be claimed and abandoned again every few
    seconds each, for as long as it lasts. The first abandoned attempt of an outage is logged
    at WARNING, the rest at DEBUG (:meth:`abandoned`); an attempt that goes through ends the
    outage with one INFO saying how many were abandoned (:meth:`went_through`), but only an
    attempt of one that was abandoned in it, or any once ``quiet_s`` passed with none
    abandoned: a run that needs nothing of the failing store (no spilled value) goes through
    while it lasts, and ending the outage on it logged a WARNING and an INFO again and again.

    One per logging component (a ``StageRunner``, the native kernel), never global: the state
    is the instance's, so two engines in one process keep apart."""

    QUIET = " (further attempts abandoned until one goes through are logged at DEBUG)"
    """The note the WARNING ends with."""

    KEYS_MAX = 10_000
    """The abandoned attempts remembered per outage (past it, only the quiet time ends it)."""

    def __init__(self, quiet_s: float = 10.0) -> None:
        self.count = 0
        """Attempts abandoned since the outage began (0: no outage)."""
        self.quiet_s = quiet_s
        self._keys: set[Any] = set()
        self._last = 0.0
        self._lock = threading.Lock()

    def abandoned(self, key: Any = None) -> tuple[int, str]:
        """Count one abandoned attempt (of job or stage ``key``): the level to log it at
        (WARNING for the first of an outage, DEBUG after) and the note to end its message
        with (:attr:`QUIET` on the WARNING, else empty)."""
        with self._lock:
            self.count += 1
            first = self.count == 1
            if key is not None and len(self._keys) < self.KEYS_MAX:
                self._keys.add(key)
            self._last = time.monotonic()
        return (logging.WARNING, self.QUIET) if first else (logging.DEBUG, "")

    def went_through(self, key: Any = None) -> int:
        """An attempt (of ``key``) went through: how many were abandoned in the outage it
        ends (0: none ended, else log one INFO with it)."""
        with self._lock:
            if not self.count:
                return 0
            quiet = time.monotonic() - self._last >= self.quiet_s
            if not (quiet or key is None or key in self._keys):
                return 0
            count, self.count = self.count, 0
            self._keys.clear()
        return count

    def report(self, logger: Callable[..., None], key: Any = None) -> None:
        """:meth:`went_through`, logging the INFO through ``logger(level, msg, *args)`` (a
        ``Logger.log`` or a ``StageLog``) when an outage ends."""
        if count := self.went_through(key):
            logger(
                logging.INFO,
                "the engine's storage answers again: %d attempt(s) were abandoned meanwhile",
                count,
            )


# InvalidInputError (PayloadTooLargeError too): a name or value over a backend's limits never
# fits on a retry either; a spilled value the blob store does not hold does not come back by
# itself (an unreachable store is a storage fault instead: the attempt is abandoned)
_NEVER_RETRY = (
    SerializationError,
    StepError,
    DefinitionError,
    InvalidInputError,
    SpilledPayloadUnavailableError,
)


async def _no_exit(body: Awaitable[Any]) -> Any:
    """``await body``, its ``SystemExit`` or ``GeneratorExit`` turned into ``StageExitError``
    in the body's own task: a task that raises ``SystemExit`` stops the event loop, and a
    ``GeneratorExit`` a task ends with is thrown into the task awaiting it, which closes every
    coroutine that awaits (none can catch it: the run stayed running for ever)."""
    try:
        return await body
    except (SystemExit, GeneratorExit) as exc:
        raise StageExitError(exc) from None


async def _handing(body: Awaitable[Any], handed: asyncio.Future[Any]) -> Any:
    """``_no_exit(body)``, whose result or error is also set on ``handed`` (unless its
    waiter is gone: cancelled) from this task's own step, as ``asyncio.shield``'s done
    callbacks would a turn of the loop later."""
    try:
        result = await _no_exit(body)
    except asyncio.CancelledError:
        if not handed.done():
            handed.cancel()
        raise
    except BaseException as exc:
        if not handed.done():
            handed.set_exception(exc)
        raise
    if not handed.done():
        handed.set_result(result)
    return result


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a finished task's error retrieved (asyncio logs one never retrieved)."""
    if task.done() and not task.cancelled():
        task.exception()


def _no_exit_sync(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a sync body's thread, as :func:`_no_exit` for a coroutine."""
    try:
        return fn(*args)
    except (SystemExit, GeneratorExit) as exc:
        raise StageExitError(exc) from None


def _body_error(exc: BaseException, cancel: asyncio.Event | None = None) -> BaseException:
    """What a body raised, as the attempt's error: the engine's cancellation of the attempt
    and an interrupt of the process go on; any other ``BaseException`` fails the attempt (it
    would otherwise leave the stage running until its lease expired, and then again, for
    ever): ``SystemExit``, ``GeneratorExit``, and a ``CancelledError`` the body raised while
    its task was not being cancelled and its ``cancel`` event (the request's
    ``cancel_event``: set when the engine found the attempt's lease gone and stops it) was
    not set (a task of its own that was cancelled) as ``StageExitError``."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is None or task.cancelling() or (cancel is not None and cancel.is_set()):
            raise exc  # the engine cancels the attempt (a lost lease, a cancelled run)
        return StageExitError(exc)
    if isinstance(exc, SystemExit | GeneratorExit):
        return StageExitError(exc)
    return exc


def _error_info(exc: BaseException, stage: str, fn: Any = None) -> ErrorInfo:
    """The stored record of ``exc`` raised by the user's ``fn``, with its traceback from
    ``fn`` down: never a database error's SQL text or parameters."""
    return ErrorInfo(
        type=type(exc).__name__,
        message=safe_error_message(exc),
        stage=stage,
        traceback=format_user_traceback(exc, fn),
    )


def _log_outcome(
    slog: StageLog,
    stage: Stage,
    attempt: int,
    outcome: Outcome,
    what: str,
    abandoned: AbandonedAttempts | None = None,
    key: Any = None,
) -> None:
    """One record per outcome: INFO for completed and suspended, WARNING for a failure that
    is retried, ERROR (with the traceback) for a failure for good. An abandoned attempt is
    counted in ``abandoned``: WARNING for the first of an outage, DEBUG after; the first
    attempt through again logs the INFO that ends the outage."""
    if abandoned is not None and not isinstance(outcome, Abandoned):
        abandoned.report(slog, key)
    if isinstance(outcome, Completed):
        slog(logging.INFO, f"{what} completed")
    elif isinstance(outcome, Suspended):
        until = "" if outcome.until is None else f" until {outcome.until.isoformat()}"
        slog(
            logging.INFO,
            f"{what} suspended, waiting for {outcome.waiting_for}{until}",
            wfe_waiting_for=outcome.waiting_for,
            wfe_until=None if outcome.until is None else outcome.until.isoformat(),
        )
    elif isinstance(outcome, Abandoned):
        level, note = abandoned.abandoned(key) if abandoned is not None else (logging.WARNING, "")
        slog(
            level,
            f"{what} abandoned: the engine's storage failed (%s); it runs again after a "
            f"backoff without using up a retry{note}",
            outcome.reason,
        )
    else:
        err = outcome.error
        retry = stage.retry
        if outcome.retryable and attempt < retry.max_attempts:
            delay = retry.delay_after(attempt).total_seconds()
            slog(
                logging.WARNING,
                f"{what} failed with %s: %s; retrying in %gs (attempt %d of %d)",
                err.type,
                err.message,
                delay,
                attempt + 1,
                retry.max_attempts,
                wfe_error_type=err.type,
                wfe_retry_in=delay,
            )
            return
        why = "not retryable" if not outcome.retryable else "no attempts left"
        tb = f"\n{err.traceback}" if err.traceback else ""
        slog(
            logging.ERROR,
            f"{what} failed for good (%s) with %s: %s%s",
            why,
            err.type,
            err.message,
            tb,
            wfe_error_type=err.type,
            wfe_retry_in=None,
        )


def _span_attrs(req: StageRequest) -> dict[str, Any]:
    return attributes(
        req.run_id,
        req.workflow.id,
        req.version or req.workflow.version,
        stage=req.stage_id,
        attempt=req.attempt,
    )


def _span_outcome(sp: SpanHandle, outcome: Outcome) -> None:
    """``wfe.outcome`` on an attempt's (or compensation's) span; a failure sets status ERROR."""
    kind = type(outcome).__name__.lower()
    sp.set("wfe.outcome", kind)
    if isinstance(outcome, Suspended):
        sp.set("wfe.waiting_for", outcome.waiting_for)
    elif isinstance(outcome, Failed):
        sp.set("wfe.retryable", outcome.retryable)
        sp.fail(outcome.error.type, outcome.error.message)


class StageRunner:
    """Runs stage bodies and compensations. Holds no run state between calls; it owns the
    pool of threads sync bodies run in (:meth:`close` it with its engine) and counts the
    attempts it abandoned during an outage of the engine's storage (:attr:`abandoned`)."""

    def __init__(
        self,
        registry: Registry,
        clock: Clock | None = None,
        cancel_grace: float = CANCEL_GRACE_S,
        *,
        default_timeout: float | None = None,
        sync_threads: int = DEFAULT_SYNC_STAGE_THREADS,
        max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
        absolute_timeout: float | None = None,
    ) -> None:
        self.registry = registry
        self.absolute_timeout = absolute_timeout
        self.clock: Clock = clock or SystemClock()
        self.cancel_grace = cancel_grace
        self.default_timeout = default_timeout
        self.max_payload_bytes = max_payload_bytes
        self.max_event_bytes: int | None = None
        """The most the business events of one attempt may weigh together, as JSON (None: no
        bound); a driver whose backend carries them in one message of bounded size sets it
        (Temporal: a stage activity's result), with ``event_bound`` saying why."""
        self.event_bound = ""
        # sync bodies run here, never in the loop's default executor (blob I/O uses that one);
        # no thread starts before the first sync body, and close() stops the idle ones
        self.sync_threads = sync_threads
        self.sync_executor = SyncStageExecutor(sync_threads)
        self.metrics: EngineMetrics | None = None
        """Set by a worker that serves metrics (``wfe worker --metrics-port``)."""
        self.abandoned = AbandonedAttempts()
        """Attempts (and compensations) this runner abandoned on a storage fault since one
        went through: one WARNING per outage, not one per attempt."""

    @classmethod
    def for_settings(
        cls, registry: Registry, clock: Clock | None, settings: EngineSettings
    ) -> StageRunner:
        """The runner a driver uses: every setting that shapes an attempt (default stage
        timeout, sync stage threads, payload limit) applied the same way on every driver."""
        return cls(
            registry,
            clock,
            default_timeout=settings.default_stage_timeout,
            sync_threads=settings.sync_stage_threads,
            max_payload_bytes=settings.max_payload_bytes,
            absolute_timeout=settings.job_absolute_timeout or None,
        )

    def close(self) -> None:
        """Stop the idle sync stage threads; never waits for a body that does not return. The
        runner stays usable: a later sync body starts a fresh pool."""
        old, self.sync_executor = self.sync_executor, SyncStageExecutor(self.sync_threads)
        old.shutdown()

    def timeout_of(self, stage: Stage) -> float | None:
        """The effective per-attempt timeout in seconds: the stage's own, else the default,
        never above the host's ``job_absolute_timeout``."""
        own = stage.timeout.total_seconds() if stage.timeout is not None else self.default_timeout
        cap = self.absolute_timeout
        if cap is None:
            return own
        return cap if own is None else min(own, cap)

    def _context(self, req: StageRequest, ledger: StepLedger, slog: StageLog) -> StageContext[Any]:
        wf = req.workflow
        events: list[BusinessEvent] = []
        return StageContext(
            # (a copy: a model's dict or Any fields kept the driver's objects, which it hands
            # to the sibling stages too)
            input=wf.validate_input(json_copy(req.input)),
            run_id=req.run_id,
            stage_id=req.stage_id,
            attempt=req.attempt,
            workflow=wf,
            step=Steps(
                SizeCheckedLedger(ledger, self.max_payload_bytes),
                self.clock,
                lambda: {name for stage in wf.stages.values() for name in stage.signals},
                events,
            ),
            events=events,
            max_payload_bytes=self.max_payload_bytes,
            registry=self.registry,
            outputs=req.outputs,
            cancel_event=req.cancel_event,
            _loop=asyncio.get_running_loop(),
            log=slog.user_logger(),
        )

    async def _invoke(self, req: StageRequest, stage: Stage, fn: Any, *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await self._bounded(stage, fn(*args))
        ctx = contextvars.copy_context()
        executor = self.sync_executor
        future = executor.submit(functools.partial(ctx.run, _no_exit_sync, fn, *args))
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # a timeout or a cancel: a queued body is dropped; a running one cannot be stopped
            if executor.abandon(future):
                stats = executor.stats()
                log.warning(
                    "sync stage %r of run %s attempt %d did not return after its timeout or "
                    "cancellation; its thread is abandoned (%d abandoned now, %d so far). Sync "
                    "bodies cannot be interrupted: make them return, or write the stage as "
                    "`async def`",
                    stage.id,
                    req.run_id,
                    req.attempt,
                    stats["sync_abandoned_running"],
                    stats["sync_abandoned_total"],
                )
            raise
        if inspect.isawaitable(result):  # a callable object or wrapper returning a coroutine
            return await result
        return result

    async def _bounded(self, stage: Stage, body: Any) -> Any:
        """Await ``body`` in a task of its own. Once cancelled, the body gets
        ``cancel_grace`` seconds to stop; a body that ignores cancellation longer is left
        behind (it cannot be killed) and the cancellation goes on, so no body holds the
        engine. A body that catches the cancellation and returns in time has returned.

        As ``await asyncio.shield(task)``, but the task hands its end to the caller itself
        (:func:`_handing`): shield's two done callbacks were two more callbacks of the loop
        per attempt, and a turn of the loop more before the caller resumed."""
        loop = asyncio.get_running_loop()
        handed: asyncio.Future[Any] = loop.create_future()
        task: asyncio.Future[Any] = loop.create_task(_handing(body, handed))
        try:
            return await handed
        except asyncio.CancelledError:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=self.cancel_grace)
            if task in done:
                return task.result()  # the body's own CancelledError, or what it returned
            task.add_done_callback(_retrieve)  # (its late error is nobody's, as with shield)
            log.warning(
                "stage %r ignored cancellation for %gs and was left running; let "
                "asyncio.CancelledError propagate from stage bodies",
                stage.id,
                self.cancel_grace,
            )
            raise
        except BaseException:
            _retrieve(task)  # (the caller has its error: the task's is not "never retrieved")
            raise

    async def run(self, req: StageRequest, ledger: StepLedger) -> Outcome:
        """Execute (or replay) one attempt of a stage. Cancellation propagates as
        ``asyncio.CancelledError``. A fault of the ledger (the engine's storage) returns
        :class:`Abandoned`, never :class:`Failed`."""
        stage = req.workflow.get_stage(req.stage_id)
        slog = StageLog(req.run_id, req.workflow.id, stage.id, req.attempt)
        slog(logging.INFO, "stage resumed" if req.resumed else "stage started")
        began = time.monotonic()
        attrs = functools.partial(_span_attrs, req)  # (made only when a span is recorded)
        with span("wfe.stage", attrs, parent=req.trace_context, stage=True) as sp:
            try:
                outcome = await self._guarded(
                    req, stage, ledger, slog, lambda ctx, g: self._attempt(req, stage, ctx, g)
                )
            except asyncio.CancelledError:
                slog(logging.INFO, "stage cancelled")
                sp.set("wfe.outcome", "cancelled")
                self._measure(req, stage, None, began)
                raise
            _span_outcome(sp, outcome)
        self._measure(req, stage, outcome, began)
        key = (req.run_id, stage.id)
        _log_outcome(slog, stage, req.attempt, outcome, "stage", self.abandoned, key)
        return outcome

    async def _guarded(
        self,
        req: StageRequest,
        stage: Stage,
        ledger: StepLedger,
        slog: StageLog,
        body: Callable[[StageContext[Any], GuardedLedger], Awaitable[Outcome]],
    ) -> Outcome:
        """Run ``body`` (an attempt or a compensation) against ``ledger`` guarded for faults of
        the engine's storage: such a fault abandons it (DESIGN §5), never fails it."""
        guarded = GuardedLedger(ledger)
        try:
            ctx = self._context(req, guarded, slog)
        except InvalidInputError as exc:
            return Failed(ErrorInfo.of(exc, stage.id), retryable=False)
        try:
            outcome = await body(ctx, guarded)
        finally:
            # a step, emit or hook of a context that leaked out of the body (a task it did not
            # await) raises StepError from now on, on every driver
            ctx.step.close()
        if guarded.fault is not None and not isinstance(outcome, Abandoned):
            # even if the body caught the fault (a bare except) and went on: the step it was
            # journaling is not journaled, so what the attempt returned cannot be trusted
            return self._abandoned(stage, guarded.fault)
        return outcome

    async def _attempt(
        self, req: StageRequest, stage: Stage, ctx: StageContext[Any], guarded: GuardedLedger
    ) -> Outcome:
        timeout = self.timeout_of(stage)
        try:
            async with asyncio.timeout(timeout) as scope:
                if stage.after_signal is not None:
                    await ctx.step._gate(stage.after_signal, stage.after_signal_timeout)
                result = await self._invoke(req, stage, stage.fn, ctx)
        except Suspend as s:
            return Suspended(s.reason, s.until, s.waiting_for, s.step)
        except InfrastructureFault as fault:
            return self._abandoned(stage, fault)
        except TimeoutError as exc:
            if timeout is not None and scope.expired():
                subject = f"stage {stage.id!r} attempt {req.attempt}"
                return self._ran_out(stage, timeout, guarded, subject, "the stage")
            return self._failed(stage, exc, stage.fn)
        except BaseException as exc:
            return self._failed(stage, _body_error(exc, req.cancel_event), stage.fn)
        try:
            output = to_json_value(result, f"output of stage {stage.id!r}")
            check_json(output, f"output of stage {stage.id!r}")
            check_payload_size(output, f"output of stage {stage.id!r}", self.max_payload_bytes)
            if stage.output_type not in (Any, None):
                validate_as(stage.output_type, output)
            self._check_events(stage, ctx.events)
        except (SerializationError, InvalidInputError) as exc:
            return Failed(ErrorInfo.of(exc, stage.id), retryable=False)
        except Exception as exc:
            err = SerializationError(
                f"output of stage {stage.id!r} does not match its return annotation: {exc}"
            )
            return Failed(ErrorInfo.of(err, stage.id), retryable=False)
        return Completed(output, tuple(ctx.events))

    def _check_events(self, stage: Stage, events: Sequence[BusinessEvent]) -> None:
        """PayloadTooLargeError when the attempt's events weigh more than ``max_event_bytes``
        together: the attempt fails (never retried: the same body emits the same events)
        instead of a result its backend refuses (a Temporal run emitting a 3 MB event stayed
        running for ever)."""
        limit = self.max_event_bytes
        if limit is None or not events:
            return
        size = len(dumps([{"type": e.type, "data": e.data} for e in events]))
        if size > limit:
            what = f"the events stage {stage.id!r} emitted ({len(events):,})"
            raise PayloadTooLargeError(what, size, limit, bound=self.event_bound)

    def _measure(
        self,
        req: StageRequest,
        stage: Stage,
        outcome: Outcome | None,
        began: float,
        *,
        compensation: bool = False,
    ) -> None:
        if self.metrics is not None:
            seconds = time.monotonic() - began
            self.metrics.stage_outcome(req, stage, outcome, seconds, compensation=compensation)

    def values_missing(
        self, req: StageRequest, exc: SpilledPayloadUnavailableError, *, compensation: bool = False
    ) -> Failed:
        """The outcome of an attempt (or a compensation) whose input, upstream outputs or
        recorded output the driver could not load because the blob store lacks them (deleted
        by hand, a store restarted without its data, a host pointed at another store): failed
        for good with the error, logged as any failure is; the body never ran. The data does
        not come back by itself: the operator restores it (or fixes ``blob_url``) and redrives
        the run. (An unreachable store is a storage fault: the attempt is abandoned.)"""
        stage = req.workflow.get_stage(req.stage_id)
        slog = StageLog(req.run_id, req.workflow.id, stage.id, req.attempt)
        outcome = Failed(ErrorInfo.of(exc, stage.id), retryable=False)
        _log_outcome(slog, stage, req.attempt, outcome, "compensation" if compensation else "stage")
        return outcome

    def _ran_out(
        self, stage: Stage, limit: float, guarded: GuardedLedger, subject: str, body: str
    ) -> Outcome:
        """The outcome of an attempt (or compensation) ``subject`` whose time limit ran out:
        abandoned when it ran out while the engine's storage was journaling (a slow or
        reconnecting database: not the stage's fault), else a retryable StageTimeoutError."""
        if guarded.interrupted:
            expired = TimeoutError(f"the stage timeout of {limit:g}s expired")
            return self._abandoned(stage, InfrastructureFault("a ledger call", expired))
        if stage.timeout is None:
            what = f"the default stage timeout of {limit:g}s (default_stage_timeout)"
            todo = "give the stage its own timeout= or raise default_stage_timeout"
        else:
            what, todo = f"its timeout of {limit:g}s", "raise the stage timeout="
        err = StageTimeoutError(f"{subject} ran longer than {what}; {todo}, or make {body} faster")
        return Failed(ErrorInfo.of(err, stage.id), retryable=True)

    def _abandoned(self, stage: Stage, fault: InfrastructureFault) -> Abandoned:
        return Abandoned(str(fault))  # logged with the outcome

    def _failed(self, stage: Stage, exc: BaseException, fn: Any) -> Failed:
        retryable = stage.retry.is_retryable(exc) and not isinstance(exc, _NEVER_RETRY)
        return Failed(_error_info(exc, stage.id, fn), retryable=retryable)

    async def compensate(self, req: StageRequest, output: JSON, ledger: StepLedger) -> Outcome:
        """Run the stage's compensation once with its recorded output. Returns Completed(None),
        Failed (the driver applies the stage's retry policy) or Abandoned (run it again after
        a backoff, not counted as a try)."""
        stage = req.workflow.get_stage(req.stage_id)
        if stage.compensation_fn is None:
            return Completed(None)
        slog = StageLog(req.run_id, req.workflow.id, stage.id, req.attempt)
        slog(logging.INFO, "compensation started")
        attrs = functools.partial(_span_attrs, req)  # (made only when a span is recorded)
        with span("wfe.compensation", attrs, parent=req.trace_context, stage=True) as sp:
            try:
                outcome = await self._guarded(
                    req,
                    stage,
                    ledger,
                    slog,
                    lambda ctx, g: self._compensation(req, stage, ctx, g, output),
                )
            except asyncio.CancelledError:
                slog(logging.INFO, "compensation cancelled")
                sp.set("wfe.outcome", "cancelled")
                self._measure(req, stage, None, 0.0, compensation=True)
                raise
            _span_outcome(sp, outcome)
        self._measure(req, stage, outcome, 0.0, compensation=True)
        key = (req.run_id, stage.id)
        _log_outcome(slog, stage, req.attempt, outcome, "compensation", self.abandoned, key)
        return outcome

    async def _compensation(
        self,
        req: StageRequest,
        stage: Stage,
        ctx: StageContext[Any],
        guarded: GuardedLedger,
        output: JSON,
    ) -> Outcome:
        # a compensation try is bounded by its stage's timeout, as an attempt is: one that
        # hung left the run compensating for ever on native, and on Temporal its activity
        # (start-to-close: the stage timeout plus a grace) was retried for ever
        limit = self.timeout_of(stage)
        try:
            async with asyncio.timeout(limit) as bound:
                value = validate_as(stage.output_type, output)
                await self._invoke(req, stage, stage.compensation_fn, ctx, value)
        except InfrastructureFault as fault:
            return self._abandoned(stage, fault)
        except TimeoutError as exc:
            if limit is None or not bound.expired():
                return self._failed(stage, exc, stage.compensation_fn)
            subject = f"compensation of stage {stage.id!r}"
            return self._ran_out(stage, limit, guarded, subject, "the compensation")
        except Suspend:
            err = StepError(
                f"compensation of stage {stage.id!r} tried to sleep or wait; compensations run "
                "to completion, use ctx.step.run only"
            )
            return Failed(ErrorInfo.of(err, stage.id), retryable=False)
        except BaseException as exc:
            return self._failed(stage, _body_error(exc, req.cancel_event), stage.compensation_fn)
        return Completed(None)
