"""In-process answers to ``TemporalEngine.signal``: what became of a signal, straight from the
signal handler of a worker in the same process, without the ``wfe.internal.delivery`` query.

Each engine owns one ``DeliveryWaiters`` (delivery id -> a future on the engine's loop). Every
worker the engine builds gets a ``_run_end.WorkerExterns`` over it, which hands the workflows of
that worker (and only those) the waiters' ``decided`` as the extern function
``DELIVERY_DECIDED`` (temporalio's per-worker ``unsafe_extern_functions``: no module-level
state). The workflow's signal handler calls it, when not replaying, once it decided what became
of a signal (``SignalHandlers._decided``); the call issues no command and its result is not
used, so the workflow stays deterministic. ``signal()`` expects the answer (``expect``) before
it sends the signal and falls back to the query when the answer does not come (the run's
worker is in another process, or an older driver's).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import (
    UnsandboxedWorkflowRunner,
    WorkflowInstance,
    WorkflowInstanceDetails,
)

from ._names import DELIVERY_DECIDED

__all__ = ["AnswersAfterActivation", "DeliveryWaiters"]


class DeliveryWaiters:
    """The signals this engine sent and still waits to hear about, by delivery id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # ``decided`` runs on a workflow thread
        self._futures: dict[str, asyncio.Future[dict[str, Any]]] = {}

    def expect(self, delivery: str) -> asyncio.Future[dict[str, Any]]:
        """A future (on the running loop) for what the run decides about ``delivery``; the
        caller must ``forget`` it once done with it, whatever happened."""
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._futures[delivery] = fut
        return fut

    def forget(self, delivery: str) -> None:
        with self._lock:
            self._futures.pop(delivery, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._futures)

    def decided(self, delivery: Any, decision: Any) -> None:
        """(The extern function; called on the workflow's thread.) Resolve the future of
        ``delivery`` on its loop. Never raises into the workflow: a delivery this engine did
        not send (another engine's, an operator's) or no longer waits for is ignored."""
        try:
            with self._lock:
                fut = self._futures.get(delivery) if isinstance(delivery, str) else None
            if fut is None or not isinstance(decision, dict):
                return
            fut.get_loop().call_soon_threadsafe(_settle, fut, dict(decision))
        except Exception:
            return  # (its loop closed: the caller is gone)


def _settle(fut: asyncio.Future[dict[str, Any]], decision: dict[str, Any]) -> None:
    if not fut.done():  # (cancelled meanwhile, or a repeat of the delivery)
        fut.set_result(decision)


class _LastWord:
    """The decisions one workflow instance makes in an activation, the last per delivery,
    told with ``tell`` (the worker's ``DELIVERY_DECIDED``) once the activation ended."""

    def __init__(self, tell: Callable[[Any, Any], None]) -> None:
        self._tell = tell
        self._decisions: dict[Any, Any] = {}

    def note(self, delivery: Any, decision: Any) -> None:
        self._decisions[delivery] = decision

    def tell(self) -> None:
        decisions, self._decisions = self._decisions, {}
        for delivery, decision in decisions.items():
            self._tell(delivery, decision)


class AnswersAfterActivation(UnsandboxedWorkflowRunner):
    """temporalio's unsandboxed runner (``_workflow.workflow_runner``), whose workflow
    instances tell the engine what became of a signal once the activation that decided it
    ended (``_LastWord``): its last word, never a decision the same activation revised."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        tell = det.extern_functions.get(DELIVERY_DECIDED)
        if tell is None:  # (a replayer, a worker without this engine's externs)
            return super().create_instance(det)
        last = _LastWord(tell)
        externs = {**det.extern_functions, DELIVERY_DECIDED: last.note}
        instance = super().create_instance(dataclasses.replace(det, extern_functions=externs))
        activate = instance.activate

        def activated(act: WorkflowActivation) -> WorkflowActivationCompletion:
            try:
                return activate(act)
            finally:
                last.tell()

        instance.activate = activated  # type: ignore[method-assign]
        return instance
