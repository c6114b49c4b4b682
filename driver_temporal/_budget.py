"""What the stage activities of one workflow task and the run's memo carry inline (runs with
``StartDocument.carry_budget``, since 2026-12-06).

Every stage activity's input carries the run's input and the outputs of the stages it comes
after, each inline up to the spill threshold (DESIGN §5: the Web UI shows them). Each is small,
but a workflow task schedules many activities at once (a fan-out), and a stage after many
others carries all their outputs: Temporal refuses a payload over 2 MiB and a workflow task
completion over 4 MB, and terminated the run (``GrpcMessageTooLarge``) where the native driver
completes it (1 -> 500 with a 30 KB output upstream: 15 MB in one completion). So once the
values the activities of one workflow task carry pass ``carry_budget`` bytes, the larger ones
go behind a claim-check reference, stored in the BlobStore by the worker running the task (the
``SIGNAL_STORED`` extern function, as an operator's large signal is) before the task completes;
a replay only rebuilds the reference (its key is the value's hash). The activity reads a
reference as it reads any spilled value. So does the engine in the ``wfe_run`` memo, which shows
every stage's output: past the budget, the larger ones are shown as references.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pydantic_core
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from engine_port import ClaimCheck, is_spill_ref

    from ._names import SIGNAL_STORED
    from ._outbox import WorkerFault
    from ._wire import spill_key

__all__ = ["CarryBudget", "store_from_task"]

_BOX = "$wfe_inline"  # (engine_port's box of an inline value: ``box_inline``)
_KEPT_INLINE = 512  # a value this small stays inline even past the budget (its reference
# would be about as big)


def store_from_task(run_id: str, key: str, data: bytes, what: str) -> None:
    """Store ``data`` under ``key`` in the BlobStore from workflow code: the worker running this
    workflow task does it (the ``SIGNAL_STORED`` extern function); a replay does not (the key
    is the value's hash: the reference is rebuilt as it was). A store that fails fails the
    workflow task (WorkerFault), which Temporal runs again. ``what``: e.g. "a signal"."""
    if workflow.unsafe.is_replaying():
        return
    store = workflow.extern_functions().get(SIGNAL_STORED)
    if store is None:
        raise WorkerFault(
            f"this worker cannot store {what} of run {run_id!r}: run it on a worker the wfe "
            "Temporal driver builds (engine.worker())"
        )
    try:
        store(key, data)
    except Exception as exc:
        raise WorkerFault(
            f"the worker could not store {what} of run {run_id!r}: {type(exc).__name__}: {exc}"
        ) from exc


class CarryBudget:
    """A base of ``GraphWorkflow``: the byte tally of the workflow task being run."""

    _run_id: str

    def _init_budget(self) -> None:
        self._budget_at = -1  # the history length of the task the tally is for
        self._budget_used = 0
        self._sizes: dict[int, tuple[Any, int]] = {}  # id(value) -> (value, JSON bytes)
        self._stored_refs: dict[str, Any] = {}  # digest -> reference (stored in this execution)

    def _size(self, value: Any) -> int:
        if value is None or isinstance(value, bool | int | float):
            return 8
        known = self._sizes.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        size = len(pydantic_core.to_json(value))
        self._sizes[id(value)] = (value, size)
        return size

    def _within_budget(self, task: dict[str, Any], budget: int | None) -> None:
        """Keep the business values of ``task`` inline while the tally of this workflow task
        stays within ``budget``; past it, store its larger values and carry references."""
        if not budget:
            return
        at = workflow.info().get_current_history_length()
        if at != self._budget_at:
            self._budget_at, self._budget_used = at, 0
        outputs: dict[str, Any] = task.get("outputs") or {}
        sizes = {a: self._size(v) for a, v in outputs.items()}
        total = self._size(task.get("input")) + self._size(task.get("output")) + sum(sizes.values())
        if self._budget_used + total <= budget:
            self._budget_used += total
            return
        for field in ("input", "output"):
            if self._size(task.get(field)) > _KEPT_INLINE:
                task[field] = self._stored(task[field])
        task["outputs"] = {
            a: self._stored(v) if sizes[a] > _KEPT_INLINE else v for a, v in outputs.items()
        }
        self._budget_used += sum(self._size(v) for v in task["outputs"].values())

    def _memo_within_budget(self, info: dict[str, Any], budget: int | None) -> None:
        """The ``wfe_run`` memo ``info`` shows each stage's output inline; past ``budget``
        bytes of them, the larger ones as references to the BlobStore (the engine reads a
        memo's outputs as it reads any stored value). Temporal refuses a memo over 2 MB: the
        run's last workflow task failed for ever (500 stages of 30 KB outputs, 15 MB)."""
        if not budget:
            return
        stages: list[dict[str, Any]] = info.get("stages") or []
        sizes = [self._size(s.get("output")) for s in stages]
        if sum(sizes) <= budget:
            return
        for stage, size in zip(stages, sizes, strict=True):
            if size > _KEPT_INLINE:
                stage["output"] = self._stored(stage["output"])

    def _carried_within_budget(
        self, signals: list[dict[str, Any]], stages: dict[str, Any], budget: int | None
    ) -> None:
        """The queued ``signals`` and the ``stages`` (``StageState``) a continue-as-new
        carries in its input payload: past ``budget`` bytes of their payloads and outputs,
        the larger ones (largest first, until the rest is within it) go behind references
        to the BlobStore. Temporal refuses a payload over 2 MiB: 2,100 signals of 1 KB
        queued while a stage waited for another name made every workflow task of the run
        try to continue carrying them and fail (``PayloadsTooLarge``), for ever. A stage
        activity reads a lent or taken payload with ``claim.load``, the engine a stage's
        output as any spilled value, and a snapshot or redrive carries stored forms."""
        if not budget:
            return
        values: list[tuple[int, str, Any]] = []  # (bytes, "signal" | "stage", index or id)
        total = 0
        for i, sig in enumerate(signals):
            size = self._size(sig.get("payload"))
            total += size
            if size > _KEPT_INLINE:
                values.append((size, "signal", i))
        for sid, st in stages.items():
            size = self._size(st.output)
            total += size
            if size > _KEPT_INLINE:
                values.append((size, "stage", sid))
        if total <= budget:
            return
        # largest first (a stable sort: the same order on every replay)
        for size, kind, at in sorted(values, key=lambda v: -v[0]):
            if kind == "signal":
                ref = self._stored(signals[at]["payload"])
                signals[at]["payload"] = ref
            else:
                ref = self._stored(stages[at].output)
                stages[at] = stages[at].model_copy(update={"output": ref})
            total -= size - self._size(ref)
            if total <= budget:
                return

    def _stored(self, value: Any) -> Any:
        """``value`` (a stored form: inline, boxed or a reference) behind a reference to the
        BlobStore, which the worker running this workflow task stores (a replay does not)."""
        if is_spill_ref(value):
            return value
        if isinstance(value, dict) and len(value) == 1 and _BOX in value:
            value = value[_BOX]  # (a user value shaped like engine metadata, boxed)
        data = pydantic_core.to_json(value)
        digest = hashlib.sha256(data).hexdigest()
        ref = self._stored_refs.get(digest)
        if ref is not None:
            return ref
        key = spill_key(self._run_id, "carried", f"v-{digest[:32]}")
        store_from_task(self._run_id, key, data, "a value")
        ref = ClaimCheck.reference(key, data)
        self._stored_refs[digest] = ref
        return ref
