"""Re-pinning a stranded run in place (a base of ``_workflow.GraphWorkflow``; runs started with
``StartDocument.repins_in_place`` only).

``TemporalEngine.redrive(run, version=...)`` of a run that is pending or suspended (no stage
attempt running) moves it to another version of its workflow with the same stages and
dependencies (``engine_port.driver.repin_plan``), as the native driver does in one
transaction: nothing is re-run (completed stages, journals, waits, timers and queued signals
stay), ``redrive_count`` + 1, a ``run.redriven`` event (``from: last_failure``, the new
version), and the next attempt (or resume) runs the new version's body. Here in three steps:

1. ``wfe.internal.repin`` ``{version, graph}`` on a worker of the run's version (the engine
   hosts a workflow-only one while it runs none, started once Temporal admitted the update:
   ``_repinning._update``): the run *holds* its stage attempts (none
   starts or resumes, ``_repin_gate``) and withdraws those scheduled that no worker picked up
   (their attempt is scheduled again once re-pinned, no second ``stage.started``: as a
   freeze's, ``_freezing``). An attempt a worker runs is left running and refuses the re-pin
   (``RunNotActiveError``, the hold lifted) unless it ends within the request's ``wait``.
2. The engine moves the execution's PINNED versioning override to the new version
   (``UpdateWorkflowExecutionOptions``): its next workflow task goes to a worker of the new
   version, which replays the history (the same driver code: the same commands).
3. ``wfe.internal.repin`` ``{version, apply: true}``: in the first workflow task that a worker
   of the new version runs (``workflow.info().get_current_deployment_version()``, recorded in
   the history, so a replay takes the same branch) the run takes the new graph and version,
   emits ``run.redriven``, writes its memo and ``WfeVersion``, and lifts the hold.

Until step 3 applies, no command depends on the new version: a workflow task of the old
version's worker (a signal, a timer) keeps holding; of the new one, applies. The journal a
stage's steps go to stays the execution's (``_journal``, its start document's ``redrive``):
the steps a suspended attempt journaled before the re-pin are read by its next try; a
continue-as-new carries the new graph, version and redrive (ledgers in its stages).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from engine_port import GraphModel, Lifecycle

    from ._names import INTERNAL, REPIN_UPDATE
    from ._search import SA_VERSION
    from ._start import StartDocument, declared_signals
    from ._state import StageState

__all__ = ["REPIN_UPDATE", "RepinHandlers"]

# seconds the first step waits, by default, for an attempt it withdrew (or found in flight)
# to come back
_WAIT_S = 5.0


def _refusal(message: str, kind: str, **details: Any) -> ApplicationError:
    return ApplicationError(message, details, type=kind, non_retryable=True)


class RepinHandlers:
    """The ``wfe.internal.repin`` update and the hold; the state it reads and changes is
    ``GraphWorkflow``'s (declared here for the type checker)."""

    _run_id: str
    _version: str
    _start: StartDocument
    _graph: GraphModel
    _stages: dict[str, StageState]
    _redrive: int
    _lc: Lifecycle
    _ready: bool
    _frozen: bool
    _final: bool
    _status: str
    _migrated_to: str | None
    _stop_reason: str | None
    _cancel_seen: bool
    _inflight: int
    _locals: int
    _ahead: dict[str, dict[str, Any]]
    _calls: dict[str, dict[str, Any]]
    _freeze_cancels: set[int]
    _group_of: dict[str, int] | None
    _signal_names: frozenset[str] | None
    _repin_to: dict[str, Any] | None
    _repins: bool
    _dirty: bool
    _info: dict[str, Any]

    # (methods of the other bases and ``GraphWorkflow``, some later in the MRO: annotated,
    # not defined, so that none is shadowed here)
    _sync: Callable[[], None]
    _emit: Callable[[Any], None]
    _declare_signals: Callable[[], None]

    def _init_repin(self, start_memo: Any) -> None:
        """(``__init__``) No re-pin waits; whether the run takes one (``repins_in_place``)."""
        self._repin_to = None
        self._repins = isinstance(start_memo, dict) and bool(start_memo.get("repins_in_place"))

    def _refuse_repin(self) -> None:
        if self._migrated_to is not None or self._frozen:
            raise _refusal(
                f"run {self._run_id!r} is being moved to another driver (frozen); retry the "
                "redrive once the move completed or was aborted",
                "MigrationError",
            )
        if self._final or self._status == "compensating" or self._cancel_seen:
            raise _refusal(
                f"run {self._run_id!r} is {self._status if self._final else 'compensating'}",
                "RunNotActiveError",
                status=self._status if self._final else "compensating",
            )
        if self._ahead or self._locals:
            # a local attempt runs inside the run's workflow task: nothing to withdraw
            sid = next(iter(self._ahead), None) or self._running_stage()
            raise _refusal(
                f"run {self._run_id!r}: stage {sid!r} is running an attempt now",
                "RunNotActiveError",
                running=sid,
            )

    def _winding(self) -> bool:
        return self._final or self._status == "compensating"

    def _running_stage(self) -> str:
        for sid, st in self._stages.items():
            if st.status == "running":
                return sid
        return next(iter(self._stages), "?")

    def _build_id(self) -> str | None:
        """The build id (version) of the worker that runs this workflow task (None: an
        unversioned worker, as in a replay test without deployment data)."""
        current = workflow.info().get_current_deployment_version()
        return None if current is None else current.build_id

    def _repin_due(self) -> bool:
        """A re-pin waits to be applied, and this workflow task runs on its version."""
        return self._repin_to is not None and self._build_id() == self._repin_to["version"]

    @workflow.update(name=REPIN_UPDATE, description=INTERNAL)
    async def on_repin(self, body: dict[str, Any]) -> dict[str, Any]:
        if not self._ready:
            await workflow.wait_condition(lambda: self._ready)
        version = str(body["version"])
        pending = self._repin_to is not None and self._repin_to["version"] == version
        if body.get("abort"):  # (the engine could not move the pin: lift the hold)
            if pending and not self._repin_due():
                self._repin_to = None
        elif body.get("apply"):
            if pending:
                await workflow.wait_condition(
                    lambda: self._repin_to is None or self._repin_due() or self._winding()
                )
                if self._repin_due() and not self._winding():
                    self._apply_repin()
            if self._version == version:
                # (the run as re-pinned, once its memo is written in this activation: what
                # redrive() returns, as native's answer from the re-pin's transaction; a read
                # after it may find the run already finished by the new version's worker)
                await workflow.wait_condition(lambda: not self._dirty)
                return {"version": self._version, "applied": True, "info": self._info}
        else:
            self._refuse_repin()
            if not pending and version != self._version:
                await self._hold(version, body)
            return {"version": self._version, "applied": self._repin_to is None}
        return {"version": self._version, "applied": self._version == version}

    @on_repin.validator
    def _validate_repin(self, body: dict[str, Any]) -> None:
        if not self._repins:
            # (a run started before: its history has no such update, and it takes none; a
            # validator's refusal writes nothing to the history)
            raise _refusal(
                f"run {workflow.info().workflow_id!r} was started before re-pins in place",
                "UnsupportedFeatureError",
            )
        if self._ready and not (body.get("apply") or body.get("abort")):
            self._refuse_repin()  # (steps 3 and undo check in the handler: ``_winding``)

    async def _hold(self, version: str, body: dict[str, Any]) -> None:
        """Step 1: hold the stage attempts for a re-pin to ``version``, withdraw those no
        worker picked up; refuse (and lift the hold) when one a worker runs does not end
        within the request's ``wait``."""
        self._repin_to = {"version": version, "graph": body["graph"]}
        for call in self._calls.values():  # (``_freezing.MigrationHandlers._withdraw``)
            if not call["withdrawn"]:
                call["withdrawn"] = True
                # (one a worker runs asks why it was cancelled, and goes on)
                self._freeze_cancels.add(call["token"])
                call["handle"].cancel()
        if not self._inflight:
            return
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: not self._inflight or self._final,
                timeout=float(body.get("wait") or _WAIT_S),
                timeout_summary="re-pin: wait for running stages",
            )
        if self._inflight or self._final:
            self._repin_to = None
            self._refuse_repin()
            sid = next(iter(self._calls), None) or self._running_stage()
            raise _refusal(
                f"run {self._run_id!r}: stage {sid!r} is running an attempt now",
                "RunNotActiveError",
                running=sid,
            )

    async def _repin_gate(self) -> None:
        """Hold a stage attempt while a re-pin waits (step 1 done, not applied); apply it in
        the first workflow task a worker of the new version runs. Returns at once (no yield,
        no command) when no re-pin waits: every run that is never re-pinned runs as before."""
        if self._repin_to is None:
            return
        await workflow.wait_condition(lambda: self._repin_to is None or self._repin_due())
        if self._repin_due():
            self._apply_repin()

    def _apply_repin(self) -> None:
        """Take the new version's graph (same stages and dependencies) and go on."""
        target, self._repin_to = self._repin_to, None
        assert target is not None
        graph = target["graph"]
        self._graph = GraphModel.model_validate(graph)
        self._version = str(target["version"])
        self._group_of = None
        self._redrive += 1
        self._lc = Lifecycle(self._run_id, self._redrive)
        names = declared_signals(graph)
        self._start = self._start.model_copy(
            update={
                "version": self._version,
                "graph": graph,
                "redrive": self._redrive,
                "redrive_from": "last_failure",
                "signal_names": names,
            }
        )
        self._signal_names = None if names is None else frozenset(names)
        self._declare_signals()
        self._emit(self._lc.run_redriven("last_failure", self._version))
        workflow.upsert_search_attributes([SA_VERSION.value_set(self._version)])
        self._sync()
