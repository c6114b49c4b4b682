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
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ._clock import Clock, SystemClock
from ._context import BusinessEvent, StageContext, Steps, Suspend
from ._faults import GuardedLedger, InfrastructureFault
from ._graph import Stage, Workflow
from ._ledger import StepLedger
from ._models import ErrorInfo
from ._registry import Registry
from ._serde import JSON, to_json_value, validate_as
from .errors import (
    DefinitionError,
    InvalidInputError,
    SerializationError,
    StageTimeoutError,
    StepError,
)

__all__ = [
    "Abandoned",
    "Completed",
    "Failed",
    "Outcome",
    "StageRequest",
    "StageRunner",
    "Suspended",
]

log = logging.getLogger("wfe.runner")

CANCEL_GRACE_S = 5.0
"""How long a cancelled stage body (or compensation) may take to stop before the engine stops
waiting for it, so a body that ignores cancellation cannot hang a worker's shutdown."""


@dataclass(frozen=True)
class StageRequest:
    """One stage attempt to execute."""

    run_id: str
    workflow: Workflow[Any]
    stage_id: str
    attempt: int
    input: JSON
    outputs: Mapping[str, JSON] = field(default_factory=dict)
    cancel_event: asyncio.Event | None = None


@dataclass(frozen=True)
class Completed:
    output: JSON
    events: tuple[BusinessEvent, ...] = ()


@dataclass(frozen=True)
class Suspended:
    reason: Literal["sleep", "signal", "poll"]
    until: datetime | None
    waiting_for: str


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

_NEVER_RETRY = (SerializationError, StepError, DefinitionError)


class StageRunner:
    """Runs stage bodies and compensations; holds no state between calls."""

    def __init__(
        self, registry: Registry, clock: Clock | None = None, cancel_grace: float = CANCEL_GRACE_S
    ) -> None:
        self.registry = registry
        self.clock: Clock = clock or SystemClock()
        self.cancel_grace = cancel_grace

    def _context(self, req: StageRequest, ledger: StepLedger) -> StageContext[Any]:
        wf = req.workflow
        return StageContext(
            input=wf.validate_input(req.input),
            run_id=req.run_id,
            stage_id=req.stage_id,
            attempt=req.attempt,
            workflow=wf,
            step=Steps(ledger, self.clock),
            registry=self.registry,
            outputs=req.outputs,
            cancel_event=req.cancel_event,
            _loop=asyncio.get_running_loop(),
        )

    async def _invoke(self, stage: Stage, fn: Any, *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await self._bounded(stage, fn(*args))
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(None, functools.partial(ctx.run, fn, *args))
        if inspect.isawaitable(result):  # a callable object or wrapper returning a coroutine
            return await result
        return result

    async def _bounded(self, stage: Stage, body: Any) -> Any:
        """Await ``body`` in a task of its own. Once cancelled, the body gets
        ``cancel_grace`` seconds to stop; a body that ignores cancellation longer is left
        behind (it cannot be killed) and the cancellation goes on, so no body holds the
        engine. A body that catches the cancellation and returns in time has returned."""
        task: asyncio.Future[Any] = asyncio.ensure_future(body)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=self.cancel_grace)
            if task in done:
                return task.result()  # the body's own CancelledError, or what it returned
            log.warning(
                "stage %r ignored cancellation for %gs and was left running; let "
                "asyncio.CancelledError propagate from stage bodies",
                stage.id,
                self.cancel_grace,
            )
            raise

    async def run(self, req: StageRequest, ledger: StepLedger) -> Outcome:
        """Execute (or replay) one attempt of a stage. Cancellation propagates as
        ``asyncio.CancelledError``. A fault of the ledger (the engine's storage) returns
        :class:`Abandoned`, never :class:`Failed`."""
        stage = req.workflow.get_stage(req.stage_id)
        guarded = GuardedLedger(ledger)
        try:
            ctx = self._context(req, guarded)
        except InvalidInputError as exc:
            return Failed(ErrorInfo.of(exc, stage.id), retryable=False)
        outcome = await self._attempt(req, stage, ctx, guarded)
        if guarded.fault is not None and not isinstance(outcome, Abandoned):
            # even if the body caught the fault (a bare except) and went on: the step it was
            # journaling is not journaled, so what the attempt returned cannot be trusted
            return self._abandoned(stage, guarded.fault)
        return outcome

    async def _attempt(
        self, req: StageRequest, stage: Stage, ctx: StageContext[Any], guarded: GuardedLedger
    ) -> Outcome:
        timeout = None if stage.timeout is None else stage.timeout.total_seconds()
        try:
            async with asyncio.timeout(timeout) as scope:
                result = await self._invoke(stage, stage.fn, ctx)
        except Suspend as s:
            return Suspended(s.reason, s.until, s.waiting_for)
        except InfrastructureFault as fault:
            return self._abandoned(stage, fault)
        except TimeoutError as exc:
            if timeout is not None and scope.expired() and guarded.interrupted:
                # the time ran out while the engine's storage was journaling (a slow or
                # reconnecting database): not the stage's fault
                slow = InfrastructureFault(
                    "a ledger call", TimeoutError(f"the stage timeout of {timeout:g}s expired")
                )
                return self._abandoned(stage, slow)
            if timeout is not None and scope.expired():
                err: BaseException = StageTimeoutError(
                    f"stage {stage.id!r} attempt {req.attempt} ran longer than its timeout of "
                    f"{timeout:g}s; raise the stage timeout= or make the stage faster"
                )
                return Failed(ErrorInfo.of(err, stage.id), retryable=True)
            return self._failed(stage, exc)
        except Exception as exc:
            return self._failed(stage, exc)
        try:
            output = to_json_value(result, f"output of stage {stage.id!r}")
            if stage.output_type not in (Any, None):
                validate_as(stage.output_type, output)
        except SerializationError as exc:
            return Failed(ErrorInfo.of(exc, stage.id), retryable=False)
        except Exception as exc:
            err = SerializationError(
                f"output of stage {stage.id!r} does not match its return annotation: {exc}"
            )
            return Failed(ErrorInfo.of(err, stage.id), retryable=False)
        return Completed(output, tuple(ctx.events))

    def _abandoned(self, stage: Stage, fault: InfrastructureFault) -> Abandoned:
        log.warning(
            "stage %r: attempt abandoned, the engine's storage failed (%s); it runs again "
            "after a backoff without using up a retry",
            stage.id,
            fault,
        )
        return Abandoned(str(fault))

    def _failed(self, stage: Stage, exc: BaseException) -> Failed:
        retryable = stage.retry.is_retryable(exc) and not isinstance(exc, _NEVER_RETRY)
        return Failed(ErrorInfo.of(exc, stage.id), retryable=retryable)

    async def compensate(self, req: StageRequest, output: JSON, ledger: StepLedger) -> Outcome:
        """Run the stage's compensation once with its recorded output. Returns Completed(None),
        Failed (the driver applies the stage's retry policy) or Abandoned (run it again after
        a backoff, not counted as a try)."""
        stage = req.workflow.get_stage(req.stage_id)
        if stage.compensation_fn is None:
            return Completed(None)
        guarded = GuardedLedger(ledger)
        try:
            ctx = self._context(req, guarded)
        except InvalidInputError as exc:
            return Failed(ErrorInfo.of(exc, stage.id), retryable=False)
        outcome = await self._compensation(req, stage, ctx, output)
        if guarded.fault is not None and not isinstance(outcome, Abandoned):
            return self._abandoned(stage, guarded.fault)
        return outcome

    async def _compensation(
        self, req: StageRequest, stage: Stage, ctx: StageContext[Any], output: JSON
    ) -> Outcome:
        try:
            value = validate_as(stage.output_type, output)
            await self._invoke(stage, stage.compensation_fn, ctx, value)
        except InfrastructureFault as fault:
            return self._abandoned(stage, fault)
        except Suspend:
            err = StepError(
                f"compensation of stage {stage.id!r} tried to sleep or wait; compensations run "
                "to completion, use ctx.step.run only"
            )
            return Failed(ErrorInfo.of(err, stage.id), retryable=False)
        except Exception as exc:
            return self._failed(stage, exc)
        return Completed(None)
