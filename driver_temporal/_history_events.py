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
number. A workflow task in flight (started, not completed) is left out: its events are not
committed yet (on the native driver: its transaction has not committed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.common import RawValue
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

from ._workflow import GraphWorkflow, workflow_runner

__all__ = ["run_events"]

# a workflow task that has not completed (yet): what it did is not committed
_UNCOMMITTED = (
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
)


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
    """Hands each workflow instance the replayer creates to ``instances``."""

    def __init__(self, instances: list[_Recording]) -> None:
        self.instances = instances

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        instances = self.instances

        class Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                found = workflow.instance()
                assert isinstance(found, _Recording)
                instances.append(found)
                return await super().execute_workflow(input)

        return Inbound


async def run_events(client: Client, run_id: str) -> list[Event]:
    """Every event of ``run_id`` its executions' committed workflow tasks emitted, in sequence
    order (delivered to the sink or not)."""
    histories = await _histories(client, run_id)
    instances: list[_Recording] = []
    replayer = Replayer(
        workflows=[_Recording],
        interceptors=[_Collect(instances)],
        workflow_runner=workflow_runner(),
        data_converter=client.data_converter,
    )
    for history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            raise EngineError(
                f"the history of run {run_id!r} does not replay on this driver's code "
                f"({result.replay_failure}); read its events in the Temporal Web UI, or "
                "use the driver version that ran it"
            )
    by_id = {e["id"]: e for i in instances for e in i.recorded}
    return sorted((Event.model_validate(e) for e in by_id.values()), key=lambda e: e.seq)


async def _histories(client: Client, run_id: str) -> list[WorkflowHistory]:
    """The committed history of every execution of the run's workflow id, oldest first (the
    latest one even when visibility does not list it yet)."""
    executions: list[str] = []
    try:
        async for ex in client.list_workflows(f'WorkflowId = "{run_id}"'):
            executions.append(ex.run_id)
    except RPCError as exc:
        raise DriverUnavailableError(f"Temporal list of {run_id!r} failed: {exc}") from None
    try:
        latest = (await client.get_workflow_handle(run_id).describe()).run_id
    except RPCError as exc:
        if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise RunNotFoundError(run_id) from None
        raise DriverUnavailableError(f"Temporal describe of {run_id!r} failed: {exc}") from None
    runs = [r for r in reversed(executions) if r != latest] + [latest]
    histories: list[WorkflowHistory] = []
    for handle in (client.get_workflow_handle(run_id, run_id=r) for r in runs):
        try:
            history = await handle.fetch_history()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                continue
            raise DriverUnavailableError(f"Temporal history of {run_id!r} failed: {exc}") from None
        events = list(history.events)
        while events and events[-1].event_type in _UNCOMMITTED:
            events.pop()
        if events:
            histories.append(WorkflowHistory(run_id, events))
    if not histories:
        raise RunNotFoundError(run_id)
    return histories
