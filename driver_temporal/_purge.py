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
are still in use.

Temporal deletes an execution asynchronously, and one that closed recently only once the server
has recorded that its close was handled (``history.transferProcessorUpdateAckInterval``: every
30 s by default, every second on ``wfe dev temporal``); until then it is still described and
listed, and a start with its id is refused as a duplicate. A purged run must be gone as on the
native driver (``get_run`` and ``wait`` raise RunNotFoundError, ``list_runs`` does not list it,
a start with its idempotency key starts a new run), so purge sends every deletion at once (at
most ``_IN_FLIGHT`` RPCs in flight), deletes the blobs, and then waits, with one deadline
(``CONFIRM_S``) for all, until Temporal neither lists (one visibility query per ``_CHUNK``)
nor describes any of them, sending the deletions of those left again now and then (the
server retries a refused deletion on a backoff, 3 s x 1.5: runs that had just closed went
31-53 s after purge, 6-24 s with the deletions sent again). Runs that ended over ~30 s ago go
at once (200 of them: 0.9 s). What is still there at the deadline is reported with
DriverUnavailableError: the next purge finishes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import (
    DeleteWorkflowExecutionRequest,
    DescribeWorkflowExecutionRequest,
)
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from engine_port.driver import delete_prefixes
from engine_port.errors import DriverUnavailableError

from ._helpers import _quote, in_background
from ._wire import _safe

if TYPE_CHECKING:
    from ._engine import TemporalEngine

__all__ = ["purge_runs", "retention", "run_blob_prefixes"]

log = logging.getLogger("wfe.worker")
RETENTION_EVERY_S = 60.0
"""How often a worker applies the ``retention`` setting (sooner when retention is shorter)."""


_FINISHED = ("completed", "failed", "cancelled", "migrated")

CONFIRM_S = 90.0
"""How long purge waits for Temporal to delete the executions it purged (see above)."""
_IN_FLIGHT = 32  # RPCs at once
_CHUNK = 100  # executions per visibility query
_POLL_FIRST_S, _POLL_MAX_S = 0.05, 1.0
_RESEND_FIRST_S, _RESEND_MAX_S = 1.0, 4.0

T = TypeVar("T")


def run_blob_prefixes(run_id: str) -> list[str]:
    """Every blob prefix that holds data of one run (state, outputs, journals, events)."""
    return [
        f"runs/{run_id}/",
        f"runs/{_safe(run_id)}/",
        f"outbox/{_safe(run_id)}/",
        f"dlq/{run_id}/",
    ]


async def purge_runs(engine: TemporalEngine, older_than: timedelta) -> int:
    """Delete the runs that finished more than ``older_than`` ago; returns how many, once
    Temporal has deleted them (see the module's docstring)."""
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
    try:
        async for ex in client.list_workflows(query):
            executions.setdefault(ex.id, []).append(ex.run_id)
    except RPCError as exc:
        raise DriverUnavailableError(
            f"Temporal did not list the runs to purge ({exc}); check the server's health and "
            "call purge again"
        ) from None
    if not executions:
        return 0
    try:
        # the executions a run continued as new from (``GraphWorkflow._continue``) keep the
        # active WfeStatus they had: they go with their run
        await _add_continued(client, executions)
    except RPCError as exc:
        raise DriverUnavailableError(
            f"Temporal did not list the runs to purge ({exc}); check the server's health and "
            "call purge again"
        ) from None
    gate = asyncio.Semaphore(_IN_FLIGHT)
    reopened = await asyncio.gather(*(_bounded(gate, _reopened(engine, r)) for r in executions))
    runs = {
        r: ids for (r, ids), again in zip(executions.items(), reopened, strict=True) if not again
    }
    targets = {(run_id, execution_id) for run_id, ids in runs.items() for execution_id in ids}
    await _delete_executions(engine, targets, gate)
    prefixes = sorted({p for run_id in runs for p in run_blob_prefixes(run_id)})
    if prefixes:
        await delete_prefixes(engine.blob_store, prefixes)
    left = await _until_deleted(engine, targets, gate)
    if left:
        ids = sorted({run_id for run_id, _ in left})
        raise DriverUnavailableError(
            f"Temporal has not finished deleting {len(ids)} of the {len(runs)} run(s) this "
            f"purge deleted after {CONFIRM_S:g}s (e.g. {', '.join(map(repr, ids[:3]))}): their "
            "blob data is deleted, but get_run and list_runs may show them until Temporal "
            "removes their executions (it deletes asynchronously, a busy cluster later); "
            "call purge again to finish"
        )
    return len(runs)


async def _add_continued(client: Any, executions: dict[str, list[str]]) -> None:
    """Add to ``executions`` (run id -> execution ids) the executions of those runs that
    continued as new (one visibility query per ``_CHUNK`` runs)."""
    ids = sorted(executions)
    for i in range(0, len(ids), _CHUNK):
        quoted = ", ".join(f"'{_quote(r)}'" for r in ids[i : i + _CHUNK])
        query = f"WorkflowId IN ({quoted}) AND ExecutionStatus = 'ContinuedAsNew'"
        async for ex in client.list_workflows(query):
            if ex.run_id not in executions[ex.id]:
                executions[ex.id].append(ex.run_id)


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

    async with in_background(loop(), "wfe-retention"):
        yield


async def _bounded(gate: asyncio.Semaphore, call: Awaitable[T]) -> T:
    async with gate:
        return await call


async def _reopened(engine: TemporalEngine, run_id: str) -> bool:
    try:
        desc = await engine._conn.get_workflow_handle(run_id).describe()
    except RPCError:
        return False  # already gone from Temporal: its blobs are what is left
    return desc.status == WorkflowExecutionStatus.RUNNING


async def _delete_executions(
    engine: TemporalEngine, targets: Iterable[tuple[str, str]], gate: asyncio.Semaphore
) -> None:
    await asyncio.gather(*(_bounded(gate, _delete_execution(engine, *t)) for t in targets))


async def _delete_execution(engine: TemporalEngine, run_id: str, execution_id: str) -> None:
    request: Any = DeleteWorkflowExecutionRequest(
        namespace=engine.settings.temporal_namespace,
        workflow_execution=WorkflowExecution(workflow_id=run_id, run_id=execution_id),
    )
    # gone already (retention, another purge), or the server is busy: _until_deleted sends
    # it again while it is still there
    with suppress(RPCError):
        await engine._conn.workflow_service.delete_workflow_execution(request)


async def _until_deleted(
    engine: TemporalEngine, targets: set[tuple[str, str]], gate: asyncio.Semaphore
) -> set[tuple[str, str]]:
    """Wait until Temporal no longer has any of the executions ``targets`` (run id, execution
    id) that purge asked it to delete, up to ``CONFIRM_S``; returns those still there."""
    loop = asyncio.get_running_loop()
    end = loop.time() + CONFIRM_S
    resend_every = _RESEND_FIRST_S
    resend_at = loop.time() + resend_every
    delay = _POLL_FIRST_S
    left = set(targets)
    while True:
        left = await _still_there(engine, left, gate)
        now = loop.time()
        if not left or now >= end:
            return left
        if now >= resend_at:
            await _delete_executions(engine, left, gate)
            resend_every = min(resend_every * 2, _RESEND_MAX_S)
            resend_at = loop.time() + resend_every
        await asyncio.sleep(min(delay, max(end - loop.time(), 0.0)))
        delay = min(delay * 2, _POLL_MAX_S)


async def _still_there(
    engine: TemporalEngine, targets: set[tuple[str, str]], gate: asyncio.Semaphore
) -> set[tuple[str, str]]:
    """Those of ``targets`` Temporal still lists (one visibility query per ``_CHUNK``) or,
    listed no more, still describes (its visibility record may go first)."""
    listed: set[tuple[str, str]] = set()
    ordered = sorted(targets)
    for i in range(0, len(ordered), _CHUNK):
        chunk = ordered[i : i + _CHUNK]
        ids = ", ".join(f"'{_quote(execution_id)}'" for _, execution_id in chunk)
        try:
            async for ex in engine._conn.list_workflows(f"RunId IN ({ids})"):
                listed.add((ex.id, ex.run_id))
        except RPCError:  # (a busy server) they count as listed: asked again next round
            listed.update(chunk)
    listed &= targets
    unlisted = sorted(targets - listed)
    found = await asyncio.gather(*(_bounded(gate, _described(engine, *t)) for t in unlisted))
    return listed | {t for t, there in zip(unlisted, found, strict=True) if there}


async def _described(engine: TemporalEngine, run_id: str, execution_id: str) -> bool:
    """Whether Temporal still has this execution (an error but NOT_FOUND: maybe)."""
    client = engine._conn
    try:
        await client.workflow_service.describe_workflow_execution(
            DescribeWorkflowExecutionRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=run_id, run_id=execution_id),
            )
        )
    except RPCError as exc:
        return exc.status != RPCStatusCode.NOT_FOUND
    return True
