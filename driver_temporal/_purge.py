"""``engine.purge(older_than=...)`` on Temporal: delete finished runs and their blob data.

Temporal keeps a closed execution's history for the namespace's retention period; the engine's
own data lives in the BlobStore beside it and has no retention of its own: spilled inputs,
outputs and signals and the run's state (``runs/<id>/``), step journals (under the same
prefix), parked events (``outbox/<id>/``) and dead letters (``dlq/<id>/``). Purge deletes,
for every run of this engine's task queues that finished (completed, failed, cancelled,
migrated; terminated or timed out in Temporal, which reads as failed) before the cutoff, its
workflow executions and then those blobs -- the same thing the native driver's ``run.purge``
deletes. Work is linear in the runs purged.

A run id whose latest execution is open again (a redrive started since) is skipped: its blobs
are still in use. Temporal deletes executions asynchronously (the dev server takes up to ~30 s):
until it has, the run is still listed and ``get_run`` of it raises
SpilledPayloadUnavailableError (its data is gone) or RunNotFoundError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from engine_port.driver import delete_prefixes

from ._wire import _safe

if TYPE_CHECKING:
    from ._engine import TemporalEngine

__all__ = ["purge_runs", "retention", "run_blob_prefixes"]

log = logging.getLogger("wfe.worker")
RETENTION_EVERY_S = 60.0
"""How often a worker applies the ``retention`` setting (sooner when retention is shorter)."""


_FINISHED = ("completed", "failed", "cancelled", "migrated")


def run_blob_prefixes(run_id: str) -> list[str]:
    """Every blob prefix that holds data of one run (state, outputs, journals, events)."""
    return [
        f"runs/{run_id}/",
        f"runs/{_safe(run_id)}/",
        f"outbox/{_safe(run_id)}/",
        f"dlq/{run_id}/",
    ]


async def purge_runs(engine: TemporalEngine, older_than: timedelta) -> int:
    """Delete the runs that finished more than ``older_than`` ago; returns how many."""
    client = engine._conn
    cutoff = (datetime.now(UTC) - older_than).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    statuses = ", ".join(f"'{s}'" for s in _FINISHED)
    # a terminated (or timed-out) execution keeps the active WfeStatus it last wrote, yet the
    # run is failed (``TemporalEngine._ended_outside``): it is purged like any failed run
    query = (
        f"{engine._scope()} AND ExecutionStatus != 'Running' AND (WfeStatus IN ({statuses}) "
        f"OR ExecutionStatus IN ('Terminated', 'TimedOut')) AND CloseTime < '{cutoff}'"
    )
    executions: dict[str, list[str]] = {}
    async for ex in client.list_workflows(query):
        executions.setdefault(ex.id, []).append(ex.run_id)
    purged = 0
    for run_id, execution_ids in executions.items():
        if await _reopened(engine, run_id):
            continue
        for execution_id in execution_ids:
            await _delete_execution(engine, run_id, execution_id)
        prefixes = sorted(set(run_blob_prefixes(run_id)))
        await delete_prefixes(engine.blob_store, prefixes)
        purged += 1
    return purged


@asynccontextmanager
async def retention(engine: TemporalEngine) -> AsyncIterator[None]:
    """While a worker runs: purge the runs older than the ``retention`` setting every minute
    (nothing when it is unset)."""
    keep = engine.settings.retention
    if keep is None:
        yield
        return

    async def loop() -> None:
        while True:
            try:
                n = await purge_runs(engine, timedelta(seconds=keep))
                if n:
                    log.info("retention: purged %d run(s) finished over %gs ago", n, keep)
            except Exception:
                log.warning("retention: purge failed; trying again later", exc_info=True)
            await asyncio.sleep(min(RETENTION_EVERY_S, keep))

    task = asyncio.create_task(loop(), name="wfe-retention")
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def _reopened(engine: TemporalEngine, run_id: str) -> bool:
    try:
        desc = await engine._conn.get_workflow_handle(run_id).describe()
    except RPCError:
        return False  # already gone from Temporal: its blobs are what is left
    return desc.status == WorkflowExecutionStatus.RUNNING


async def _delete_execution(engine: TemporalEngine, run_id: str, execution_id: str) -> None:
    request: Any = DeleteWorkflowExecutionRequest(
        namespace=engine.settings.temporal_namespace,
        workflow_execution=WorkflowExecution(workflow_id=run_id, run_id=execution_id),
    )
    with suppress(RPCError):  # deleted meanwhile (retention, another purge)
        await engine._conn.workflow_service.delete_workflow_execution(request)
