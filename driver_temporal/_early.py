"""What a run whose first workflow task has not started will make of a signal (engine side).

A signal sent to a run before its first workflow task started (no worker up yet, or none
free) waits on the server: nothing can ask the run about it (the query and the update need a
worker). Its fate is decided nonetheless: every signal the run's history holds before the
first ``WorkflowTaskStarted`` is handed to that task's signal handlers before the run set up,
and ``SignalHandlers._carry_signals`` judges them in history order against the state the
start document carries (the bound ``max_pending_signals`` on runs started with
``StartDocument.bounds_first``, the idempotency keys, the stages waiting). So
``TemporalEngine.signal`` reads that history and runs the very same judgement here
(``judged``), and answers as the native driver does from its database: buffered, delivered,
already_completed or ``SignalQueueFullError``, with no worker at all.

Once a workflow task started before the signal (the signal lands in a later task, judged
against a queue and stages only the run knows), ``judged`` returns None and the engine asks
the run.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from ._carry import meta_of
from ._signals import _JSON_ENCODINGS, SignalHandlers, _is_wrapped
from ._start import StartDocument
from ._state import StageState
from ._workflow import START_MEMO

__all__ = ["judged"]

# the events a pending run's history may hold before the signal for ``judged`` to answer:
# anything else (a cancel request, an update, a task started) and the engine asks the run
_BEFORE_FIRST_TASK = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
    }
)


class _Judge(SignalHandlers):
    """The run's signal handlers as its first workflow task has them before ``run`` set up
    (``GraphWorkflow.__init__``, then ``_setup``'s part for signals), outside any workflow."""

    def __init__(self, start: StartDocument, meta: dict[str, Any]) -> None:
        self._run_id = start.run_id
        self._start = start
        self._final = self._frozen = False
        self._migrated_to = None
        self._signals, self._signal_keys = [], set()
        self._deliveries = dict(start.deliveries) if start.continued else {}
        self._calls, self._held, self._lent, self._reserved = {}, {}, {}, {}
        self._rejected = []
        self._status = "pending"
        self._early = []
        self._read_signal_rule(meta)
        self._stages = {sid: StageState.fresh(sid, st) for sid, st in start.stages.items()}

    def _reject(self, name: str, why: str) -> None:
        pass  # (the run records it in its memo when it handles the signal)

    def _decided(self, delivery: str, res: dict[str, Any]) -> None:
        self._deliveries[delivery] = res

    def handle(self, name: str, payload: Any) -> None:
        """``SignalHandlers.on_signal`` before the run set up (no ``_start`` yet: no
        refusal but an undecodable payload), without reading or storing the value, which
        the judgement does not look at."""
        meta = meta_of(payload) if payload is not None else None
        delivery = meta.get("delivery") if meta is not None else None
        encoding = payload.metadata.get("encoding", b"") if payload is not None else b""
        value: Any = None
        if payload is not None:
            if encoding not in _JSON_ENCODINGS:
                if isinstance(delivery, str):
                    self._decided(delivery, {"rejected": "InvalidSignalPayload"})
                return
            if encoding == b"json/plain":
                try:
                    value = pydantic_core.from_json(payload.data)
                except ValueError:
                    if isinstance(delivery, str):
                        self._decided(delivery, {"rejected": "InvalidSignalPayload"})
                    return
        if meta is not None:
            self._arrived(name, None, delivery, meta.get("idempotency_key"), bounded=True)
        elif _is_wrapped(value):
            self._arrived(name, None, value.get("delivery"), value.get("idempotency_key"))
        elif self._signal_names is None or name in self._signal_names:
            self._arrived(name, None, None, None)


async def judged(events: Any, delivery: str) -> dict[str, Any] | None:
    """What the run will make of the signal sent with ``delivery`` (as ``_deliveries`` holds
    it: delivered / already_completed, or why it is rejected), read from its history
    (``events``: an async iterator of its ``HistoryEvent``), or None when a workflow task
    started before the signal, the history holds anything else before it, or does not hold
    it (the server buffers a signal while a task is in flight)."""
    judge: _Judge | None = None
    async for ev in events:
        if ev.event_type not in _BEFORE_FIRST_TASK:
            return None
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            judge = _judge_of(ev)
            if judge is None:
                return None
            continue
        if judge is None or ev.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        attrs = ev.workflow_execution_signaled_event_attributes
        payload = attrs.input.payloads[0] if attrs.input.payloads else None
        judge.handle(attrs.signal_name, payload)
        meta = meta_of(payload) if payload is not None else None
        if meta is not None and meta.get("delivery") == delivery:
            judge._carry_signals(judge._start)
            return judge._deliveries.get(delivery)
    return None


def _judge_of(ev: HistoryEvent) -> _Judge | None:
    """The signal handlers of the run the started event begins, or None for a run started
    before ``wfe_start`` was in the memo (its first task has long run)."""
    attrs = ev.workflow_execution_started_event_attributes
    raw_memo = attrs.memo.fields.get(START_MEMO)
    if raw_memo is None or not attrs.input.payloads:
        return None
    meta = pydantic_core.from_json(raw_memo.data)
    if not isinstance(meta, dict):
        return None
    carried = meta_of(attrs.input.payloads[0]) or {}
    start = StartDocument.model_validate({**meta, **carried})
    return _Judge(start, meta)
