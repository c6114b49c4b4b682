"""The migration side of ``GraphWorkflow`` (see ``_workflow``): a base class holding its update
handlers and the snapshot.

Migration (``TemporalEngine.export_run`` and friends): the ``wfe.internal.freeze`` update freezes
the run at a safe point, after which no stage starts or resumes and signals are refused, and
returns the run's snapshot: every stage activity in flight is cancelled. One that no worker had
picked up is withdrawn: its attempt started and nobody runs it, so the snapshot shows the stage
``running`` with its ledger (steps a lost earlier try journaled are read back into it) and the
target continues that attempt, as after a lost worker, without a second ``stage.started``. One
a worker runs asks the run why it was cancelled (``wfe.internal.freeze_cancelled``), learns it was a
freeze and goes on, and the freeze waits for its outcome (up to ``wait``);
``wfe.internal.complete_export`` ends the run ``migrated`` (emitting ``run.migrated`` with the
sequence number the snapshot reserved) and ``wfe.internal.abort_export`` unfreezes it. A run
started with ``imported`` in its start input resumes from a snapshot: completed stages are kept, a
suspended stage continues its attempt (same deadlines, no second ``stage.started``), event numbers
continue.

A cancellation request that reaches a frozen run (runs started since 2026-12-06:
``StartDocument.defers_frozen_cancel``): an operator's ``temporal workflow cancel``, or
``TemporalEngine.cancel`` whose memo check a freeze overtook. Temporal records it in the
history and raises ``CancelledError`` in the workflow's main coroutine, which may go on: the run
stays frozen and its move goes on (``GraphWorkflow._watched``). Cancelling it there ended it
cancelled while the target's import had it live, ``complete_export`` failed and the cancel was
lost. The cancel is deferred: an aborted move (the run stays here) applies it, a completed one
drops it (the run lives on its target, which it never reached; ``cancel()`` told its caller
with the retry-me ``MigrationError``, worker log lines tell the operator as the cancel is
deferred and as the move completes, naming the target to cancel it on). Temporal records
one cancel request per execution (a second is a no-op), so a refusal alone would leave a run
whose move was aborted uncancellable. A freeze is refused once a cancel reached the run.
"""

from __future__ import annotations

import contextlib
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from engine_port import GraphModel

    from ._names import (
        ABORT_EXPORT_UPDATE,
        COMPLETE_EXPORT_UPDATE,
        FREEZE_CANCELLED_QUERY,
        FREEZE_UPDATE,
        INTERNAL,
    )
    from ._start import StartDocument
    from ._state import StageState

__all__ = [
    "ABORT_EXPORT_UPDATE",
    "COMPLETE_EXPORT_UPDATE",
    "FREEZE_UPDATE",
    "Migrated",
    "MigrationHandlers",
    "migration_error",
]


class Migrated(Exception):
    """Raised at every wait of a frozen run once it was moved to another engine."""


def migration_error(message: str) -> ApplicationError:
    return ApplicationError(message, type="MigrationError", non_retryable=True)


class MigrationHandlers:
    """Freeze at a safe point, snapshot, complete or abort an export. The state it reads is
    ``GraphWorkflow``'s (declared here for the type checker)."""

    _run_id: str
    _wf_id: str
    _version: str
    _start: StartDocument
    _graph: GraphModel
    _stages: dict[str, StageState]
    _signals: list[dict[str, Any]]
    _signal_keys: set[str]
    _seq: int
    _order: int
    _redrive: int
    _redrive_history: list[dict[str, Any]]
    _deadline: str | None
    _ready: bool
    _frozen: bool
    _final: bool
    _status: str
    _migrated_to: str | None
    _inflight: int
    _calls: dict[str, dict[str, Any]]
    _freeze_cancels: set[int]
    _cancel_seen: bool
    _cancel_deferred: bool
    _repin_to: dict[str, Any] | None
    _suspended_in: dict[str, dict[str, Any]]

    def _sync(self) -> None:
        raise NotImplementedError

    def _run_status(self) -> str:
        raise NotImplementedError

    def _order_ids(self) -> list[str]:
        raise NotImplementedError

    def _refuse_move(self) -> None:
        if self._migrated_to is not None:
            raise migration_error(
                f"run {self._run_id!r} was already migrated to {self._migrated_to!r}"
            )
        if self._final or self._status == "compensating":
            raise migration_error(
                f"run {self._run_id!r} is {self._status}; only pending or suspended runs, or "
                "runs between stages, can migrate (terminal runs stay where they are)"
            )
        if self._repin_to is not None:  # (``_repin``: never on a run started before it)
            raise migration_error(
                f"run {self._run_id!r} is being re-pinned to version "
                f"{self._repin_to['version']!r}; migrate it once the redrive returned (or "
                "call it again to finish the re-pin)"
            )
        if self._start.defers_frozen_cancel and (
            self._cancel_seen or (self._cancel_deferred and not self._frozen)
        ):
            # (a cancel reached the run before it froze: it winds down here; or a cancel it
            # deferred while frozen is due, the move given up. A frozen run's deferred
            # cancel refuses no retry of its export)
            raise migration_error(
                f"run {self._run_id!r} is being cancelled; a cancelled run stays where it is "
                "(wait for it to end)"
            )

    @workflow.update(name=FREEZE_UPDATE, description=INTERNAL)
    async def on_freeze(self, body: dict[str, Any]) -> dict[str, Any]:
        if not self._ready:
            await workflow.wait_condition(lambda: self._ready)
        self._refuse_move()
        self._frozen = True
        self._withdraw()
        self._sync()

        def settled() -> bool:
            return self._inflight == 0 or self._final or self._status == "compensating"

        if not settled():
            wait = float(body.get("wait") or 0.0)
            try:
                if wait <= 0:
                    raise TimeoutError
                await workflow.wait_condition(
                    settled, timeout=wait, timeout_summary="migration: wait for running stages"
                )
            except TimeoutError:
                self._frozen = False
                self._sync()
                raise migration_error(
                    f"run {self._run_id!r} has a stage running; it is not at a safe point "
                    "(wait longer, or migrate it later)"
                ) from None
        if self._final or self._status == "compensating":
            self._frozen = False
            self._sync()
            self._refuse_move()
        return self._snapshot()

    @on_freeze.validator
    def _validate_freeze(self, body: dict[str, Any]) -> None:
        if self._ready:
            self._refuse_move()

    def _withdraw(self) -> None:
        """Cancel every stage activity in flight (see the module docstring): one no worker
        picked up comes back withdrawn, one a worker runs goes on and is waited for."""
        for call in self._calls.values():
            if not call["withdrawn"]:
                call["withdrawn"] = True
                self._freeze_cancels.add(call["token"])
                call["handle"].cancel()

    @workflow.query(name=FREEZE_CANCELLED_QUERY, description=INTERNAL)
    def freeze_cancelled(self, token: int) -> bool:
        """Whether the cancel a stage activity received came from a freeze (so it goes on)."""
        return token in self._freeze_cancels

    @workflow.update(name=COMPLETE_EXPORT_UPDATE, description=INTERNAL)
    def on_complete_export(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._migrated_to is None:
            if not self._frozen:
                raise migration_error(
                    f"run {self._run_id!r} was not exported; call export_run first"
                )
            self._migrated_to = str(body["target"])
            if self._cancel_deferred:
                # (the operator who cancelled it was told at the time only that a completed
                # move would drop the cancel: this is when it does, and where to cancel now)
                workflow.logger.warning(
                    "run %s moved to %s: the cancel it deferred while frozen is dropped here; "
                    "cancel it on %s (through that driver's engine, or a routing engine over "
                    "both)",
                    self._run_id,
                    self._migrated_to,
                    self._migrated_to,
                )
        return {"target": self._migrated_to}

    @workflow.update(name=ABORT_EXPORT_UPDATE, description=INTERNAL)
    def on_abort_export(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._migrated_to is None and self._frozen:
            self._frozen = False
            self._sync()
        return {"frozen": self._frozen}

    async def _gate(self) -> None:
        """Block while the run is frozen; raise Migrated once it moved."""
        if self._frozen or self._migrated_to is not None:
            await workflow.wait_condition(lambda: not self._frozen or self._migrated_to is not None)
        if self._migrated_to is not None:
            raise Migrated()

    async def _pause(self, seconds: float, summary: str) -> None:
        """A durable timer that a completed migration interrupts."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self._migrated_to is not None, timeout=seconds, timeout_summary=summary
            )
        if self._migrated_to is not None:
            raise Migrated()

    def _snapshot(self) -> dict[str, Any]:
        """The RunSnapshot (format 1) of the frozen run, as JSON."""
        stages = []
        current_group = len(self._graph.groups)
        for gi, group in enumerate(self._graph.groups):
            if any(self._stages[s].status != "completed" for s in group):
                current_group = gi
                break
        for sid in self._order_ids():
            st = self._stages[sid]
            status = st.shown  # (pending between attempts: the next one is scheduled)
            stages.append(
                {
                    "id": sid,
                    "status": status,
                    "attempt": st.attempt,
                    "suspensions": st.suspensions,
                    "output": st.output,
                    "has_output": status == "completed",
                    "error": st.error,
                    "compensation_error": st.compensation_error,
                    "completed_order": st.order,
                    "waiting_for": st.waiting_for,
                    "wake_at": st.wake_at,
                    "started_at": st.started_at,
                    "finished_at": st.finished_at,
                    "steps": list(st.steps.values()),
                    "staged_events": list(st.events),
                    # (the wait of the attempt's last stage.suspended, ``_suspension_noted``)
                    "suspended_in": self._suspended_in.get(sid),
                }
            )
        return {
            "run_id": self._run_id,
            "workflow_id": self._wf_id,
            "version": self._version,
            "status": self._run_status(),
            "input": self._start.input,
            "idempotency_key": self._start.idempotency_key,
            "input_fingerprint": self._start.fingerprint,
            "graph": self._start.graph,
            "current_group": current_group,
            "completed_count": self._order,
            "stages": stages,
            "signals": [dict(sig) for sig in self._signals],
            "signal_keys": sorted(self._signal_keys),
            "event_seq": self._seq + 1,  # run.migrated takes the next number
            "redrive_count": self._redrive,
            "redrive_history": self._redrive_history,
            "deadline": self._deadline,
            "created_at": self._start.created_at,
            "source": "temporal",
        }
