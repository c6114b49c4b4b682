"""Moving runs in and out of Temporal (issue 7): drains, idempotency-key records, the
workflow-only helper worker, freeze/export, complete, abort and import. Functions of
the :class:`~driver_temporal._engine.TemporalEngine` they take first."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import suppress
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pydantic_core
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError
from temporalio.worker import Worker

from engine_port import (
    RunInfo,
    RunSnapshot,
    RunStatus,
)
from engine_port.driver import GraphModel, at_its_wait
from engine_port.errors import (
    DriverUnavailableError,
    EngineError,
    IdempotencyConflictError,
    MigrationError,
    RunNotFoundError,
)

from ._freezing import ABORT_EXPORT_UPDATE, COMPLETE_EXPORT_UPDATE, FREEZE_UPDATE
from ._helpers import (
    _failure_message,
    _failure_type,
    _now,
    _pairs,
    _safe,
    _settle,
    _sha,
)
from ._start import StartDocument
from ._state import MemoStage, RunMemo, StageState
from ._wire import run_id_for_key
from ._workflow import GraphWorkflow, workflow_runner

if TYPE_CHECKING:
    from ._engine import TemporalEngine

__all__ = [
    "abort_export",
    "complete_export",
    "drain",
    "drain_key",
    "drained",
    "drop_helper",
    "export_run",
    "helper",
    "import_run",
    "key_key",
    "keyed_run",
    "scope_key",
    "update",
    "workflow_only_worker",
]


def scope_key(engine: TemporalEngine, *parts: str) -> str:
    ns, tq = engine.settings.temporal_namespace, engine.settings.task_queue
    return "/".join(["temporal", _safe(ns), _safe(tq), *parts])


def drain_key(engine: TemporalEngine, workflow_id: str) -> str:
    return scope_key(engine, "drains", _safe(workflow_id) + ".json")


def key_key(engine: TemporalEngine, key: str) -> str:
    return scope_key(engine, "keys", _sha(key) + ".json")


async def drained(engine: TemporalEngine, workflow_id: str) -> str | None:
    k = drain_key(engine, workflow_id)
    if not await engine.blob_store.has(k):
        return None
    try:
        target: str = pydantic_core.from_json(await engine.blob_store.get(k))["target"]
    except EngineError:  # lifted meanwhile
        return None
    return target


async def drain(engine: TemporalEngine, workflow_ids: Sequence[str], target: str | None) -> None:
    """Recorded in the shared BlobStore, so every engine of this cluster (same namespace
    and task queue) refuses new runs of the drained workflows."""
    for wf_id in workflow_ids:
        if target is None:
            await engine.blob_store.delete(drain_key(engine, wf_id))
        else:
            await engine.blob_store.put(
                drain_key(engine, wf_id),
                pydantic_core.to_json({"workflow_id": wf_id, "target": target}),
            )


async def keyed_run(
    engine: TemporalEngine, key: str
) -> tuple[Any, WorkflowExecutionStatus | None] | None:
    """The imported run that holds idempotency key ``key`` here, if any, also when it moved
    away again (its ``migrated`` record: ``keyed_repeat`` refuses it). Taking one that
    moved away for "no run of the key" let the start create a second run of the key under
    the key's own run id."""
    k = key_key(engine, key)
    if not await engine.blob_store.has(k):
        return None
    try:
        run_id: str = pydantic_core.from_json(await engine.blob_store.get(k))["run_id"]
        return await engine._describe(run_id)
    except (RunNotFoundError, EngineError):
        return None  # an import that never started its run


def workflow_only_worker(engine: TemporalEngine, workflow_id: str, version: str) -> Worker:
    """A worker of the version that runs workflow tasks and their local activities: event
    publishing and, when this registry serves the version, ``local=True`` stages (they run in
    the workflow task, which may be a new run's first one). It never polls for stage
    activities."""
    acts = engine._activities
    local = [acts.stage] if engine.registry.has(workflow_id, version) else []
    return Worker(
        engine._conn,
        task_queue=engine.task_queue(workflow_id),
        workflows=[GraphWorkflow],
        activities=[*local, *acts.bookkeeping()],
        no_remote_activities=True,
        max_cached_workflows=0,
        workflow_runner=workflow_runner(),
        interceptors=[engine._externs()],  # (see ``_run_end``)
        graceful_shutdown_timeout=timedelta(seconds=5),
        deployment_config=engine.deployment_config(workflow_id, version),
    )


async def helper(engine: TemporalEngine, workflow_id: str, version: str) -> None:
    """Make sure a workflow-only worker serves the run's version in this process, so
    that migration updates are answered even when no worker of the version is up."""
    key = (engine.task_queue(workflow_id), version)
    if key in engine._helpers or engine._hosted.get(key):
        return  # (one process may not run two workers of one task queue and version)
    worker = workflow_only_worker(engine, workflow_id, version)
    engine._helpers[key] = (worker, asyncio.create_task(worker.run()))


async def drop_helper(engine: TemporalEngine, key: tuple[str, str]) -> None:
    """Stop the helper of ``(task queue, version)`` (a full worker is about to serve it)."""
    helper = engine._helpers.pop(key, None)
    if helper is not None:
        worker, task = helper
        with suppress(Exception):
            await worker.shutdown()
        with suppress(BaseException):
            await task


async def update(
    engine: TemporalEngine, run_id: str, info: RunInfo, name: str, body: dict[str, Any]
) -> Any:
    await helper(engine, info.workflow_id, info.version)
    handle = engine._conn.get_workflow_handle(run_id)
    wait = float(body.get("wait") or 0.0)
    try:
        return await handle.execute_update(
            name, body, result_type=dict, rpc_timeout=timedelta(seconds=wait + 60)
        )
    except WorkflowUpdateFailedError as exc:
        if _failure_type(exc) in ("MigrationError", "RunNotActiveError"):
            raise MigrationError(_failure_message(exc)) from None
        raise MigrationError(f"run {run_id!r}: {_failure_message(exc)}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise MigrationError(
            f"run {run_id!r} did not answer the migration request in time; retry"
        ) from None
    except RPCError as exc:
        current = await engine.get_run(run_id)
        if current.terminal:
            raise MigrationError(
                f"run {run_id!r} is {current.status}; terminal runs stay where they are"
            ) from None
        raise DriverUnavailableError(f"Temporal update of {run_id!r} failed: {exc}") from None


async def export_run(engine: TemporalEngine, run_id: str, *, wait: float = 0.0) -> RunSnapshot:
    info = await engine.get_run(run_id)
    if info.status == RunStatus.MIGRATED:
        raise MigrationError(f"run {run_id!r} was already migrated to {info.migrated_to!r}")
    if info.terminal or info.status == RunStatus.COMPENSATING:
        raise MigrationError(
            f"run {run_id!r} is {info.status}; only pending or suspended runs, or runs "
            "between stages, can migrate (terminal runs stay where they are)"
        )
    data = await update(engine, run_id, info, FREEZE_UPDATE, {"wait": wait})
    return RunSnapshot.model_validate(data)


async def complete_export(engine: TemporalEngine, run_id: str, target: str) -> RunInfo:
    info = await engine.get_run(run_id)
    if info.status == RunStatus.MIGRATED:
        return info
    await update(engine, run_id, info, COMPLETE_EXPORT_UPDATE, {"target": target})
    # the execution ends once run.migrated is published
    with suppress(TimeoutError):
        await asyncio.wait_for(_settle(engine._conn, run_id), 60)
    return await engine.get_run(run_id)


async def abort_export(engine: TemporalEngine, run_id: str) -> None:
    info = await engine.get_run(run_id)
    if info.terminal:
        return
    await update(engine, run_id, info, ABORT_EXPORT_UPDATE, {})


async def import_run(engine: TemporalEngine, snapshot: RunSnapshot) -> RunInfo:
    run_id = snapshot.run_id
    reuse = WorkflowIDReusePolicy.REJECT_DUPLICATE
    try:
        memo, status = await engine._describe(run_id)
    except RunNotFoundError:
        pass
    else:
        if (memo.get("wfe_run") or {}).get("frozen"):
            # (the run being exported from this very namespace: taken for "already imported",
            # it was marked migrated to where it was, and never ran again)
            raise MigrationError(
                f"run {run_id!r} is being exported from this very Temporal namespace: the "
                "target is the source. Import it into another driver or namespace "
                "(abort_export() lets the run go on here; migrate_run does that itself)"
            )
        existing = await engine._info_from_memo(memo, status)
        if existing.status != RunStatus.MIGRATED:
            return existing  # a rerun migration never duplicates
        reuse = WorkflowIDReusePolicy.ALLOW_DUPLICATE  # it moved away and comes back
    if snapshot.graph is not None:
        graph = GraphModel.model_validate(snapshot.graph)
    else:
        graph = engine.registry.graph(snapshot.workflow_id, snapshot.version)
    key = snapshot.idempotency_key
    if key:
        await _claim_key(engine, key, run_id)
    run_started = snapshot.status != RunStatus.PENDING
    stages = _imported_stages(snapshot)
    created = (snapshot.created_at or _now()).isoformat()
    status_now = "pending" if not run_started else str(snapshot.status)
    start = _start_input(engine, snapshot, graph, stages, created=created)
    initial = _initial_memo(snapshot, graph, stages, created=created, status=status_now)
    pairs = _pairs(snapshot.version, key, status_now)
    with suppress(WorkflowAlreadyStartedError):  # a concurrent import of the same run won
        await engine._start_pinned(
            snapshot.workflow_id,
            snapshot.version,
            start,
            id=run_id,
            id_reuse_policy=reuse,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            memo={"wfe_run": initial, "wfe_fp": snapshot.input_fingerprint},
            search_attributes=TypedSearchAttributes(pairs),
            static_summary=f"{snapshot.workflow_id} {snapshot.version} "
            f"(imported from {snapshot.source or 'another engine'})",
        )
    return await engine.get_run(run_id)


async def _claim_key(engine: TemporalEngine, key: str, run_id: str) -> None:
    """Record that ``key`` names the imported run; IdempotencyConflictError when another run
    here (started through Temporal or keyed by the native id rule) already holds it."""
    holder = await keyed_run(engine, key)
    if holder is not None and holder[0]["wfe_run"]["id"] != run_id:
        raise IdempotencyConflictError(key, holder[0]["wfe_run"]["id"])
    native_id = run_id_for_key(key)
    if native_id != run_id:
        with suppress(RunNotFoundError):
            await engine._describe(native_id)
            raise IdempotencyConflictError(key, native_id)
    await engine.blob_store.put(
        key_key(engine, key), pydantic_core.to_json({"key": key, "run_id": run_id})
    )


def _imported_stages(snapshot: RunSnapshot) -> dict[str, StageState]:
    """The workflow's per-stage state (journal and staged events included) from a snapshot.
    An attempt exported ``running`` at a signal wait it suspended in already is taken in
    suspended in that wait (``at_its_wait``): the workflow lends a queued signal of the name
    to one waiter, and no other runs an activity for it. Taken in running, each ran again,
    and the one that lost the signal suspended again in its wait and sent that suspension's
    id, already sent at the source, a second time under a new sequence number."""
    stages: dict[str, StageState] = {}
    for st in map(at_its_wait, snapshot.stages):
        stages[st.id] = StageState(
            status=str(st.status),
            attempt=st.attempt,
            output=st.output if st.has_output else None,
            error=None if st.error is None else st.error.model_dump(),
            waiting_for=st.waiting_for,
            wake_at=None if st.wake_at is None else st.wake_at.isoformat(),
            started_at=None if st.started_at is None else st.started_at.isoformat(),
            finished_at=None if st.finished_at is None else st.finished_at.isoformat(),
            order=st.completed_order,
            suspensions=st.suspensions,
            steps={
                s.name: {
                    "name": s.name,
                    "kind": s.kind,
                    "completed": s.completed,
                    "result": s.result,
                    "deadline": None if s.deadline is None else s.deadline.isoformat(),
                    "signal": s.signal,
                    "meta": s.meta,
                }
                for s in st.steps
            },
            events=list(st.staged_events),
        )
    return stages


def _start_input(
    engine: TemporalEngine,
    snapshot: RunSnapshot,
    graph: GraphModel,
    stages: dict[str, StageState],
    *,
    created: str,
) -> StartDocument:
    """The workflow's start input: the run resumes where the snapshot left it."""
    return StartDocument.for_engine(
        engine.settings,
        engine.heartbeat_timeout,
        continue_after=engine.continue_as_new_events or None,
        run_id=snapshot.run_id,
        workflow_id=snapshot.workflow_id,
        version=snapshot.version,
        graph=graph.model_dump(mode="json"),
        input=snapshot.input,
        idempotency_key=snapshot.idempotency_key,
        fingerprint=snapshot.input_fingerprint,
        created_at=created,
        redrive=snapshot.redrive_count,
        redrive_history=list(snapshot.redrive_history),
        event_seq=snapshot.event_seq,
        stages=stages,
        signals=[sig.model_dump(mode="json") for sig in snapshot.signals],
        signal_keys=list(snapshot.signal_keys),
        run_started=snapshot.status != RunStatus.PENDING,
        deadline=None if snapshot.deadline is None else snapshot.deadline.isoformat(),
        imported=True,
    )


def _initial_memo(
    snapshot: RunSnapshot,
    graph: GraphModel,
    stages: dict[str, StageState],
    *,
    created: str,
    status: str,
) -> dict[str, Any]:
    """The run's memo until the workflow's first save: what get_run reads meanwhile."""
    none = StageState()  # a stage the snapshot lacks: pending
    return RunMemo(
        id=snapshot.run_id,
        workflow_id=snapshot.workflow_id,
        version=snapshot.version,
        status=status,
        input=snapshot.input,
        stages=[
            MemoStage(
                id=sid,
                status=stages.get(sid, none).status,
                attempt=stages.get(sid, none).attempt,
                output=stages.get(sid, none).output,
                waiting_for=stages.get(sid, none).waiting_for,
                wake_at=stages.get(sid, none).wake_at,
            )
            for group in graph.groups
            for sid in group
        ],
        idempotency_key=snapshot.idempotency_key,
        redrive_count=snapshot.redrive_count,
        created_at=created,
        sinks=graph.sinks(),
        event_seq=snapshot.event_seq,
        run_started=snapshot.status != RunStatus.PENDING,
    ).to_json()
