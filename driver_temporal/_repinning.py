"""The engine's side of re-pinning a stranded run in place (``TemporalEngine.redrive`` with a
version, of a run started with ``StartDocument.repins_in_place``; the workflow's side and the
three steps: ``_repin``).

The graph of the version a run was re-pinned to is kept in the BlobStore
(``runs/<run>/graphs/<version>.json``, purged with the run): the run's execution started with
its old graph, which ``TemporalEngine._started_graph`` reads for a version the registry does not
serve (a redrive or signal through ``wfe`` without --app).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pydantic_core
from temporalio.api.enums.v1 import PendingActivityState, UpdateWorkflowExecutionLifecycleStage
from temporalio.api.workflowservice.v1 import (
    DescribeWorkflowExecutionResponse,
    PollWorkflowExecutionUpdateRequest,
    UpdateWorkflowExecutionOptionsRequest,
)
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.common import PinnedVersioningOverride
from temporalio.service import RPCError, RPCStatusCode

from engine_port import RunInfo
from engine_port.driver import GraphModel, frozen_run_error
from engine_port.errors import (
    DriverUnavailableError,
    EngineError,
    RunNotActiveError,
    SpilledPayloadUnavailableError,
)

from . import _moving
from ._helpers import _failure_message, _failure_type
from ._journal import put_small
from ._names import REPIN_UPDATE
from ._wire import spill_key

if TYPE_CHECKING:
    from ._engine import TemporalEngine

__all__ = ["graph_key", "repin_in_place", "repinned_graph", "running_stage"]

_UPDATE_WAIT_S = 60.0


def graph_key(run_id: str, version: str) -> str:
    """Where the graph of the version run ``run_id`` was re-pinned to is kept."""
    return spill_key(run_id, "graphs", version, case_safe=True)


async def repinned_graph(engine: TemporalEngine, run_id: str, version: str) -> GraphModel | None:
    """The graph of ``version`` a re-pin in place gave run ``run_id``; None: never re-pinned
    there."""
    try:
        data = await engine.blob_store.get(graph_key(run_id, version))
    except SpilledPayloadUnavailableError:  # (missing)
        return None
    return GraphModel.model_validate(pydantic_core.from_json(data))


def running_stage(raw: DescribeWorkflowExecutionResponse) -> str | None:
    """The stage of a stage activity a worker runs now (the activity type is the stage id)."""
    for act in raw.pending_activities:
        if act.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
            return str(act.activity_type.name)
    return None


async def repin_in_place(
    engine: TemporalEngine,
    run_id: str,
    info: RunInfo,
    graph: GraphModel,
) -> RunInfo:
    """Re-pin the active run ``info`` (pending or suspended, no stage activity running:
    ``running_stage``) to ``graph``'s version, in the three steps of ``_repin``."""
    wf_id, version = info.workflow_id, graph.version
    await put_small(
        engine.blob_store,
        graph_key(run_id, version),
        pydantic_core.to_json(graph.model_dump(mode="json")),
    )
    # (a pinned override names a version present on the queue: as for a start)
    await engine._ensure_version(wf_id, version)
    body = {"version": version, "graph": graph.model_dump(mode="json")}
    await _update(engine, run_id, info, info.version, body)
    try:
        await _move_pin(engine, run_id, wf_id, version)
    except BaseException:
        # the hold is lifted: the run goes on on its own version, as before the call
        await _update(engine, run_id, info, info.version, {"version": version, "abort": True})
        raise
    res = await _update(engine, run_id, info, version, {"version": version, "apply": True})
    if not res.get("applied"):
        # (a cancel reached the run between the steps: it winds down on its own version)
        await _move_pin(engine, run_id, wf_id, info.version)
        current = await engine.get_run(run_id)
        raise RunNotActiveError(run_id, current.status, "redrive")
    if isinstance(res.get("info"), dict):
        return await engine._resolve(res["info"])
    return await engine.get_run(run_id)


async def _move_pin(engine: TemporalEngine, run_id: str, workflow_id: str, version: str) -> None:
    """Step 2: the execution's PINNED versioning override names ``version``."""
    client = engine._conn
    request = UpdateWorkflowExecutionOptionsRequest(namespace=client.namespace)
    request.workflow_execution.workflow_id = run_id
    override = PinnedVersioningOverride(engine.deployment_version(workflow_id, version))
    request.workflow_execution_options.versioning_override.CopyFrom(override._to_proto())
    request.update_mask.paths.append("versioning_override")
    try:
        await client.workflow_service.update_workflow_execution_options(
            request, retry=True, timeout=timedelta(seconds=30)
        )
    except RPCError as exc:
        raise DriverUnavailableError(
            f"Temporal did not re-pin run {run_id!r} to version {version!r}: {exc}; retry"
        ) from None


async def _update(
    engine: TemporalEngine, run_id: str, info: RunInfo, version: str, body: dict[str, Any]
) -> dict[str, Any]:
    """``wfe.internal.repin`` answered by a worker of ``version``: this engine hosts a
    workflow-only one while it runs none (as for a migration), started only once Temporal
    admitted the update, so that the first workflow task it runs carries the update. A
    workflow-only worker of the run's version that ran a pending task first (a signal, a
    fired timer, the run's first task) would schedule the old version's stage activities
    with no hold, and Temporal routes the activities of a version whose queue has no
    activity poller to the queue's current version (seen under load: v2's worker ran v1's
    stage, which failed the run). A helper this call started is stopped once answered."""
    key = (engine.task_queue(info.workflow_id), version)
    ours = key not in engine._helpers and not engine._hosted.get(key)
    handle = engine._conn.get_workflow_handle(run_id)
    update_id = f"wfe-repin-{uuid.uuid4().hex}"
    call = asyncio.ensure_future(
        handle.execute_update(
            REPIN_UPDATE,
            body,
            id=update_id,
            result_type=dict,
            rpc_timeout=timedelta(seconds=_UPDATE_WAIT_S),
        )
    )
    try:
        await _admitted(engine, run_id, update_id, call)
        if not call.done():
            try:
                await _moving.helper(engine, info.workflow_id, version)
            except RuntimeError as exc:
                # (Temporal's core: one worker of a task queue and build id per process;
                # another engine of this process runs a full one, which answers)
                if "multiple workers" not in str(exc):
                    raise
        res: dict[str, Any] = await call
        return res
    except WorkflowUpdateFailedError as exc:
        kind = _failure_type(exc)
        if kind == "MigrationError":
            raise frozen_run_error(run_id, "redrive", engine.driver_name) from None
        if kind == "RunNotActiveError":
            details = getattr(exc.cause, "details", None) or ()
            more = details[0] if details and isinstance(details[0], dict) else {}
            running = more.get("running")
            status = str(more.get("status") or info.status)
            raise RunNotActiveError(
                run_id, status, "redrive", running=None if running is None else str(running)
            ) from None
        raise EngineError(f"run {run_id!r}: {_failure_message(exc)}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise DriverUnavailableError(
            f"run {run_id!r} did not answer the re-pin to version {version!r} in time; retry"
        ) from None
    finally:
        if not call.done():
            call.cancel()
        if ours:
            await _moving.drop_helper(engine, key)


async def _admitted(
    engine: TemporalEngine, run_id: str, update_id: str, call: asyncio.Future[Any]
) -> None:
    """Wait until Temporal admitted update ``update_id`` (or ``call`` ended: a worker that
    polls already answered it); the server says NOT_FOUND until the request reached it."""
    client = engine._conn
    request = PollWorkflowExecutionUpdateRequest(namespace=client.namespace)
    request.update_ref.workflow_execution.workflow_id = run_id
    request.update_ref.update_id = update_id
    request.wait_policy.lifecycle_stage = (
        UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _UPDATE_WAIT_S
    while not call.done():
        try:
            await client.workflow_service.poll_workflow_execution_update(
                request, retry=False, timeout=timedelta(seconds=5)
            )
            return
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND or loop.time() > deadline:
                return  # (the update call itself says what went wrong)
        await asyncio.sleep(0.02)
