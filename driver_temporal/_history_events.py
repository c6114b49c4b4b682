"""A Temporal-driver run's event stream, read back from its workflow histories.

The workflow builds every event of the run (``_outbox.EventOutbox._emit``: the same ids,
sequence numbers and times as the native driver) from its history alone, so replaying the
history on the driver's workflow code rebuilds exactly the events the run emitted. Replaying is
needed because only part of them are *stored* in the history: the events a stage activity
carries ride in its ``ActivityTaskScheduled`` input, but those published by the ``wfe.publish``
and ``wfe.save_state`` local activities (and carried by ``local=True`` stages) are not: a local
activity's marker records its result, never its arguments.

Every execution of the run's workflow id counts (a redrive starts a new execution of the same
id, continuing the sequence numbers); events are deduplicated by id and ordered by sequence
number. Only completed workflow tasks count (``committed``): a task in flight has not
committed its events yet (on the native driver: its transaction has not committed).

Except the last task of an execution Temporal closed outside a workflow task (an operator's
terminate, an execution timeout: ``emitted``). Such a task never completes, but the worker
running it may have delivered its events before the terminate landed (they go out *during*
the task: handed to the worker, ``_outbox._hand_over``, or by the ``wfe.publish`` /
``wfe.save_state`` local activities, or with the run's end, ``_run_end``), and no later task
will ever emit events in their place. Its events are deterministic all the same: the task ran
on the history up to its ``WorkflowTaskStarted``, which the replay runs it on. So they count:
``engine.events`` lists what the sink may have received, and the closing event a worker
publishes for the run (``_ended``) and a redrive's events are numbered after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.common import RawValue
from temporalio.converter import DataConverter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from engine_port import Event, EventDraft
from engine_port.errors import DriverUnavailableError, EngineError, RunNotFoundError

from . import _rpc
from ._carry import DATA_CONVERTER, meta_of
from ._names import DELIVERY_DECIDED, EVENTS_HANDED, RUN_ENDED, SIGNAL_STORED
from ._paging import listed
from ._workflow import GraphWorkflow, workflow_runner

__all__ = [
    "committed",
    "emitted",
    "judged_by_replay",
    "replay_events",
    "replay_info",
    "run_events",
    "woken_by_signal",
]

# what a workflow task's completion records beside its commands
_TASK_MESSAGES = (
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
)
# how Temporal closes an execution without a workflow task
_CLOSED_OUTSIDE = (
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
)
# the worker's extern functions (``_run_end.WorkerExterns``): what a replayed task that is not
# a replay for the SDK (the last, uncommitted one: ``emitted``) calls; it did it, or not, then
_WORKER_FUNCTIONS = (DELIVERY_DECIDED, EVENTS_HANDED, RUN_ENDED, SIGNAL_STORED)


def _done(*_: Any) -> None:
    """A worker function in a replay: nothing to do."""


@workflow.defn(dynamic=True)
class _Recording(GraphWorkflow):
    """``GraphWorkflow`` that also keeps every event it builds (``recorded``)."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[dict[str, Any]] = []

    @workflow.run
    async def run(self, args: Sequence[RawValue]) -> Any:
        return await super().run(args)

    def _emit(self, draft: EventDraft) -> None:
        super()._emit(draft)
        self.recorded.append(self._outbox[-1])


class _Collect(Interceptor):
    """Hands each workflow instance the replayer creates to ``instances``, and gives the
    workflows the worker's functions, doing nothing."""

    def __init__(self, instances: list[_Recording]) -> None:
        self.instances = instances

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        instances = self.instances
        for name in _WORKER_FUNCTIONS:
            input.unsafe_extern_functions[name] = _done

        class Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                found = workflow.instance()
                assert isinstance(found, _Recording)
                instances.append(found)
                return await super().execute_workflow(input)

        return Inbound


def _replayer(instances: list[_Recording], data_converter: DataConverter | None) -> Replayer:
    """A replayer of the driver's workflow code that hands each instance to ``instances``."""
    return Replayer(
        workflows=[_Recording],
        interceptors=[_Collect(instances)],
        workflow_runner=workflow_runner(),
        data_converter=data_converter or DATA_CONVERTER,
        # no deadlock detector: a read of the history must not fail because the process
        # paused for 2 s during a replay (a full garbage collection beside a CPU hog)
        debug_mode=True,
    )


async def run_events(
    client: Client, run_id: str, *, deadline_s: float = 30.0, address: str | None = None
) -> list[Event]:
    """Every event of ``run_id`` its executions' committed workflow tasks emitted (and the
    last task of an execution Temporal closed outside one: ``emitted``), in sequence order
    (delivered to the sink or not). ``deadline_s``: how long the listing of its executions
    keeps trying while Temporal is down (``_rpc.read``)."""
    histories = await _histories(client, run_id, deadline_s=deadline_s, address=address)
    return await replay_events(histories, client.data_converter)


async def replay_events(
    histories: Sequence[WorkflowHistory], data_converter: DataConverter | None = None
) -> list[Event]:
    """The events the workflow tasks of ``histories`` (executions of one run) emitted
    (``emitted``: the committed ones, and the last one of an execution Temporal closed
    outside a task), deduplicated by id, in sequence order."""
    instances: list[_Recording] = []
    replayer = _replayer(instances, data_converter)
    for whole in histories:
        history = emitted(whole)
        if not history.events:
            continue  # no workflow task completed (or ran) yet: the run emitted nothing so far
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            raise EngineError(
                f"the history of run {history.workflow_id!r} does not replay on this driver's "
                f"code ({result.replay_failure}); read its events in the Temporal Web UI, or "
                "use the driver version that ran it"
            )
    by_id = {e["id"]: e for i in instances for e in i.recorded}
    return sorted((Event.model_validate(e) for e in by_id.values()), key=lambda e: e.seq)


async def replay_info(
    history: WorkflowHistory, data_converter: DataConverter | None = None
) -> dict[str, Any] | None:
    """The ``wfe_run`` RunInfo memo of the run as its committed workflow tasks in ``history``
    (one execution) left it: what its ``run_info`` query would answer, read with no worker.
    None when no task completed yet, or the history does not replay on this code."""
    history = committed(history)
    if not history.events:
        return None
    instances: list[_Recording] = []
    result = await _replayer(instances, data_converter).replay_workflow(
        history, raise_on_replay_failure=False
    )
    if result.replay_failure is not None or not instances or not instances[-1].run_info():
        return None
    return instances[-1].run_info()


_TASK_ENDED = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
)


async def judged_by_replay(
    history: WorkflowHistory, delivery: str, data_converter: DataConverter | None = None
) -> dict[str, Any] | None:
    """What the run of ``history`` (its current execution) will make of the signal sent with
    ``delivery`` once a worker runs its next workflow task, when no worker is running it now:
    the history holds everything that task will run on (the signal, and what came with it),
    so the task is run here on the driver's code, as ``emitted`` runs a task Temporal closed
    (nothing it does leaves this process), and its signal handler's answer is read as the
    worker's would be (``on_delivery``): delivered, buffered, already completed, or why it is
    refused (a full queue, a run that ends in that task). None when that cannot be told: no
    workflow task ran yet (``_early`` judges those), one was in flight when the signal came
    (its outcome is not in the history yet), the history does not hold the signal, or the
    answer waits for a ``local=True`` try (withheld)."""
    events = list(history.events)
    at = next((i for i, e in enumerate(events) if _carries(e, delivery)), None)
    if at is None:
        return None
    in_flight: bool | None = None  # (None: no workflow task started before the signal)
    ended = 0  # (where the last workflow task before the signal ended)
    for i, e in enumerate(events[:at]):
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            in_flight = True
        elif e.event_type in _TASK_ENDED:
            in_flight, ended = False, i
    if in_flight is not False:
        return None
    task = await _next_task(history, events, ended, at, data_converter)
    return None if task is None else task.on_delivery(delivery)


async def woken_by_signal(
    history: WorkflowHistory, data_converter: DataConverter | None = None
) -> bool:
    """Whether a signal the engine sent after the run's last completed workflow task woke a
    stage waiting for it (``delivered``), as the run's next workflow task will judge it, run
    here on its history as :func:`judged_by_replay` runs it: what a run whose worker is away
    is, on the native driver, from the signal's commit (``running``, its stage ``suspended``
    until a worker resumes it). False when nothing says so: no signal of the engine's since
    the last completed task, a task in flight (its completion publishes the run's state),
    answers withheld, or a history that does not replay here."""
    events = list(history.events)
    done = _last_completed_task(events)
    if done is None:
        return False
    deliveries: list[str] = []
    ended, in_flight = done, False
    for i in range(done + 1, len(events)):
        e = events[i]
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            in_flight = True
        elif e.event_type in _TASK_ENDED:
            in_flight, ended = False, i
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            delivery = _delivery_of(e)
            if delivery is not None:
                deliveries.append(delivery)
    if in_flight or not deliveries:
        return False
    task = await _next_task(history, events, ended, len(events) - 1, data_converter)
    if task is None:
        return False
    return any((task.on_delivery(d) or {}).get("delivered") is True for d in deliveries)


async def _next_task(
    history: WorkflowHistory,
    events: list[HistoryEvent],
    ended: int,
    at: int,
    data_converter: DataConverter | None,
) -> _Recording | None:
    """The run's workflow task after ``events[at]`` (the last task before it ended at
    ``events[ended]``), run here on the history with a synthetic ``WorkflowTaskStarted``:
    the workflow instance as that task leaves it, or None (no task scheduled, a history that
    does not replay here)."""
    end = next(
        (
            i
            for i in range(at + 1, len(events))
            if events[i].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
        ),
        len(events),
    )
    scheduled = [
        e for e in events[ended:end] if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    ]
    if not scheduled:
        return None
    started = HistoryEvent(
        event_id=events[end - 1].event_id + 1,
        event_time=events[end - 1].event_time,
        event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
    )
    started.workflow_task_started_event_attributes.scheduled_event_id = scheduled[-1].event_id
    instances: list[_Recording] = []
    result = await _replayer(instances, data_converter).replay_workflow(
        WorkflowHistory(history.workflow_id, [*events[:end], started]),
        raise_on_replay_failure=False,
    )
    if result.replay_failure is not None or not instances:
        return None
    return instances[-1]


def _last_completed_task(events: list[HistoryEvent]) -> int | None:
    """The index of the last ``WorkflowTaskCompleted`` of ``events`` (None: no task completed)."""
    return max(
        (
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        ),
        default=None,
    )


def _delivery_of(event: HistoryEvent) -> str | None:
    """The delivery id the engine sent the signal of ``event`` with (None: not the engine's)."""
    payloads = event.workflow_execution_signaled_event_attributes.input.payloads
    meta = meta_of(payloads[0]) if payloads else None
    delivery = meta.get("delivery") if meta is not None else None
    return delivery if isinstance(delivery, str) else None


def _carries(event: HistoryEvent, delivery: str) -> bool:
    """Whether ``event`` is the signal the engine sent with ``delivery``."""
    return (
        event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and _delivery_of(event) == delivery
    )


def committed(history: WorkflowHistory) -> WorkflowHistory:
    """``history`` up to the end of its last completed workflow task (that task's commands
    included): what a task in flight does is not committed yet, and events recorded after the
    last completed task (an activity that completed, a signal) are for the next task, which
    runs them at its own time (the event times come from the task that handles them)."""
    events = list(history.events)
    last = _last_completed_task(events)
    if last is None:
        return WorkflowHistory(history.workflow_id, [])
    task = events[last].event_id
    end = last + 1
    while end < len(events) and _from_task(events[end], task):
        end += 1
    return WorkflowHistory(history.workflow_id, events[:end])


def emitted(history: WorkflowHistory) -> WorkflowHistory:
    """The part of ``history`` whose workflow tasks' events count: ``committed(history)``;
    for an execution Temporal closed outside a workflow task (terminated, timed out) while a
    task ran (one started after the last completed one, which the close force-failed), up to
    that task's ``WorkflowTaskStarted``: what it ran on. It never completes, and no task will
    run in its place, but the worker running it may have delivered its events (they go out
    during the task): a replay runs that task again, as it ran (not a replay for the SDK: the
    worker's functions do nothing here, ``_Collect``). (Up to the first local activity it
    awaits: what that task did with a local activity's result, a ``local=True`` stage's, is
    not in the history, which records the result with the task's completion only.)"""
    events = list(history.events)
    if not events or events[-1].event_type not in _CLOSED_OUTSIDE:
        return committed(history)
    started = completed = -1
    for i, e in enumerate(events):
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = i
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            completed = i
    if started < completed:  # (none ran after the last completed one)
        return committed(history)
    return WorkflowHistory(history.workflow_id, events[: started + 1])


def _from_task(event: HistoryEvent, task: int) -> bool:
    """Whether ``event`` records what workflow task ``task`` did (a command, an update it
    accepted or completed)."""
    if event.event_type in _TASK_MESSAGES:
        return True
    kind = event.WhichOneof("attributes")
    attrs = getattr(event, kind) if kind else None
    return getattr(attrs, "workflow_task_completed_event_id", None) == task


def _failed(exc: RPCError, what: str) -> DriverUnavailableError:
    if _rpc.status_of(exc) in _rpc.UNREACHABLE:
        return _rpc.unavailable(exc, None, what)
    return DriverUnavailableError(f"Temporal refused {what}: {exc}; check the server's health")


async def _histories(
    client: Client, run_id: str, *, deadline_s: float, address: str | None
) -> list[WorkflowHistory]:
    """The history of every execution of the run's workflow id, oldest first (the
    latest one even when visibility does not list it yet)."""
    executions: list[str] = []
    query = f'WorkflowId = "{run_id}"'
    try:
        async for ex in listed(client, query, deadline_s=deadline_s, address=address):
            executions.append(ex.run_id)
    except RPCError as exc:
        raise _failed(exc, f"the list of run {run_id!r}") from None
    try:
        latest = (await client.get_workflow_handle(run_id).describe()).run_id
    except RPCError as exc:
        if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise RunNotFoundError(run_id) from None
        raise _failed(exc, f"the describe of run {run_id!r}") from None
    runs = [r for r in reversed(executions) if r != latest] + [latest]
    histories: list[WorkflowHistory] = []
    for handle in (client.get_workflow_handle(run_id, run_id=r) for r in runs):
        try:
            history = await handle.fetch_history()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                continue
            raise _failed(exc, f"the history of run {run_id!r}") from None
        histories.append(history)
    if not histories:
        raise RunNotFoundError(run_id)
    return histories
