"""What a run shows while it runs (a base of ``_workflow.GraphWorkflow``): its status, the
current details the Web UI displays, the ``WfeStatus`` / ``WfeStage`` search attributes and the
``wfe_run`` memo entry (the RunInfo ``get_run`` and ``list_runs`` read with no worker up),
written once per workflow activation by ``_syncer`` — on runs started since 2026-12-02, only
once no local activity is in flight: the activations of a workflow task that runs local
activities all go into its one completion, so writes between them showed nobody anything
and cost three history events a ``local=True`` stage. The search attributes are written only
when they change; on runs started since 2026-12-02 ``WfeStage`` names the stages a run waits or
failed in, not those that merely run (``_stage_attribute``), so a run whose stages just run
writes them only when its status changes (a 3-stage run: running, completed; it wrote 4).
Runs started since the afternoon of 2026-12-02 (``StartDocument.memo_on_change``) write the
memo the same way: only when what a reader of the memo alone acts on changes (``_memo_key``),
not at every stage that starts or completes (each write a visibility upsert the server
indexes); ``get_run`` asks the run for its stages in between (``_current``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from engine_port import GraphModel

    from ._search import SA_STAGE, SA_STATUS
    from ._start import StartDocument
    from ._state import RunMemo, StageState

__all__ = ["RunInspection"]

_SYNC_ROUNDS = 8  # condition rounds the memo write waits for an activation to settle
_IN_FLIGHT = ("running", "suspended")  # the stages ``WfeStage`` named on runs of the older shape


def _iso(value: Any) -> str:
    return str(value.isoformat())


class RunInspection:
    """The run's visible state; the attributes below are ``GraphWorkflow``'s."""

    _run_id: str
    _wf_id: str
    _version: str
    _start: StartDocument
    _graph: GraphModel
    _stages: dict[str, StageState]
    _status: str
    _final: bool
    _run_started: bool
    _carried: bool
    _closing: bool
    _dirty: bool
    _sa: tuple[str, str] | None
    _memo_at: tuple[Any, ...] | None
    _info: dict[str, Any]
    _memo_within_budget: Callable[[dict[str, Any], int | None], None]  # (``_budget``)
    _now: Callable[[], datetime]  # (``_clock``)
    _error: dict[str, Any] | None
    _comp_errors: list[dict[str, Any]]
    _redrive: int
    _finished_at: str | None
    _seq: int
    _migrated_to: str | None
    _frozen: bool
    _locals: int

    def _run_status(self) -> str:
        if self._final or self._status == "compensating":
            return self._status
        if not self._run_started:
            return "pending"
        statuses = {s.status for s in self._stages.values()}
        if "running" in statuses:
            return "running"
        if "suspended" in statuses:
            return "suspended"
        return "running"

    def _details(self, status: str) -> str:
        waits = [
            f"stage {s.id} waits for {s.waiting_for}" + (f" until {s.wake_at}" if s.wake_at else "")
            for s in self._stages.values()
            if s.status == "suspended"
        ]
        running = [s.id for s in self._stages.values() if s.status == "running"]
        parts = [f"status: {status}"]
        if running:
            parts.append("running: " + ", ".join(running))
        parts.extend(waits)
        return "; ".join(parts)

    def _sync(self) -> None:
        """Mark the run's memo and search attributes stale: ``_syncer`` writes them once at
        the end of the activation (in the same workflow task as the events it emitted)."""
        self._dirty = True

    async def _settled(self) -> None:
        """Let the rest of this activation run first, so that it writes the memo and
        publishes events once rather than once per step of it: a stage's completion and the
        next stage's start happen a few condition rounds apart in the same activation
        (``_SYNC_ROUNDS`` rounds, no commands, deterministic). Runs of the older shape did not
        wait, and still do not, so their histories replay."""
        if not self._carried:
            return
        for _ in range(_SYNC_ROUNDS):
            if self._closing:
                return
            await workflow.wait_condition(lambda: True)

    async def _syncer(self) -> None:
        after_locals = self._start.memo_after_locals
        while True:
            await workflow.wait_condition(lambda: self._dirty or self._closing)
            await self._settled()
            if after_locals and self._locals and not self._closing:
                # (its result comes in this same workflow task: write with what follows it;
                # a local activity that outlives the task's timeout shows when it ends)
                await workflow.wait_condition(lambda: not self._locals or self._closing)
                continue
            if self._dirty:
                self._dirty = False
                self._write_info()
            if self._closing:
                return

    def _stage_attribute(self) -> str:
        """The ``WfeStage`` search attribute: on runs started since 2026-12-02
        (``StartDocument.stage_attribute_waits``) the stages the run waits in (suspended) or
        failed in — a stage that merely runs is not in it (the Web UI shows it as a pending
        activity, ``get_run`` from the memo), so a run whose stages just run writes its search
        attributes only when its status changes, not at every stage it starts; on older runs
        the stages running or suspended, so their histories replay."""
        shown = ("suspended", "failed") if self._start.stage_attribute_waits else _IN_FLIGHT
        return ",".join(s.id for s in self._stages.values() if s.status in shown)

    def _memo_key(self, status: str, current: str) -> tuple[Any, ...]:
        """What a reader of the memo alone acts on (runs of ``StartDocument.memo_on_change``
        write their memo only when it changes): the status and the stages the run waits or
        failed in (``wait()``, ``signal()``: whether it ended, what a stage waits for), a
        freeze or move, the run's end, and its version (a re-pin in place)."""
        stages = self._stages.values()
        waits = tuple((s.id, s.waiting_for, s.wake_at) for s in stages if s.status == "suspended")
        # (the version and redrive change only at a re-pin in place, ``_repin``)
        return (
            status,
            current,
            waits,
            self._frozen,
            self._migrated_to,
            self._final,
            self._version,
            self._redrive,
        )

    def _write_info(self) -> None:
        status = self._run_status()
        current = self._stage_attribute()
        if self._sa != (status, current):
            self._sa = (status, current)
            workflow.upsert_search_attributes(
                [SA_STATUS.value_set(status), SA_STAGE.value_set(current)]
            )
        workflow.set_current_details(self._details(status))
        lag = self._start.memo_on_change
        memo = RunMemo(
            id=self._run_id,
            workflow_id=self._wf_id,
            version=self._version,
            status=status,
            input=self._start.input,
            error=self._error,
            compensation_errors=self._comp_errors,
            stages=[s.memo(compact=self._start.compact_memo) for s in self._stages.values()],
            idempotency_key=self._start.idempotency_key,
            redrive_count=self._redrive,
            created_at=self._start.created_at,
            updated_at=_iso(self._now()),
            finished_at=self._finished_at,
            sinks=self._graph.sinks(),
            event_seq=self._seq,
            run_started=self._run_started,
            migrated_to=self._migrated_to,
            frozen=self._frozen,
            **({"stages_lag": True} if lag else {}),
        )
        # (what ``run_info`` answers and a replay of the history reads: always current)
        self._info = memo.to_json()
        # (runs with ``carry_budget``: outputs past it go to the BlobStore, ``_budget``)
        self._memo_within_budget(self._info, self._start.carry_budget)
        if lag:
            key = self._memo_key(status, current)
            if key == self._memo_at:
                return
            self._memo_at = key
        workflow.upsert_memo({"wfe_run": self._info})
