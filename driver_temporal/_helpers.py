"""Small helpers shared by the Temporal engine and its migration support."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import pydantic_core
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import HistoryEventFilterType, PendingWorkflowTaskState
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
)

from engine_port import RunStatus
from engine_port.driver import ACTIVE_RUN_STATUSES

from ._search import SA_IDEMPOTENCY_KEY, SA_STATUS, SA_VERSION
from ._state import RunMemo

_WFT_STARTED = PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED
_ACTIVE = tuple(s.value for s in RunStatus if s in ACTIVE_RUN_STATUSES)
_ALL = tuple(s.value for s in RunStatus)

__all__ = [
    "_ACTIVE",
    "_ALL",
    "_WFT_STARTED",
    "_failure_message",
    "_failure_type",
    "_json",
    "_now",
    "_pairs",
    "_quote",
    "_safe",
    "_settle",
    "_sha",
    "_state_from_memo",
    "in_background",
]


def _now() -> datetime:
    return datetime.now(UTC)


async def _settle(client: Client, run_id: str) -> HistoryEvent | None:
    """Wait until the execution (following redrives) is closed, whatever its outcome: the
    long poll on its close event, as ``handle.result(follow_runs=True)`` makes it, without
    converting the result or the failure; the close event (None: the poll failed)."""
    request = GetWorkflowExecutionHistoryRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=run_id),
        wait_new_event=True,
        history_event_filter_type=HistoryEventFilterType.HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT,
        skip_archival=True,
    )
    with suppress(Exception):
        while True:
            page = await client.workflow_service.get_workflow_execution_history(request, retry=True)
            if not page.history.events:
                if not page.next_page_token:
                    return None
                request.next_page_token = page.next_page_token  # the long poll timed out
                continue
            following = _next_run(page.history.events[0])
            if not following:
                return page.history.events[0]
            request.execution.run_id = following
            request.next_page_token = b""
    return None


def _next_run(close: HistoryEvent) -> str:
    """The run a close event hands over to (continue-as-new, a retry), or ""."""
    for attr in (
        "workflow_execution_completed_event_attributes",
        "workflow_execution_failed_event_attributes",
        "workflow_execution_timed_out_event_attributes",
        "workflow_execution_continued_as_new_event_attributes",
    ):
        if close.HasField(attr):
            return str(getattr(close, attr).new_execution_run_id)
    return ""


def _pairs(
    version: str, key: str | None, status: str = "pending"
) -> list[SearchAttributePair[Any]]:
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(SA_VERSION, version),
        SearchAttributePair(SA_STATUS, status),
    ]
    if key:
        pairs.append(SearchAttributePair(SA_IDEMPOTENCY_KEY, key))
    return pairs


def _failure_type(exc: WorkflowUpdateFailedError) -> str | None:
    cause = exc.cause
    return getattr(cause, "type", None)


def _failure_message(exc: WorkflowUpdateFailedError) -> str:
    cause = exc.cause
    return str(getattr(cause, "message", None) or cause or exc)


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _safe(part: str) -> str:
    import re

    ok = bool(part) and part not in (".", "..") and re.fullmatch(r"[A-Za-z0-9_.\-]+", part)
    return part if ok else _sha(part)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _json(value: Any) -> Any:

    from engine_port.errors import SerializationError

    try:
        return pydantic_core.to_jsonable_python(value)
    except Exception as exc:
        raise SerializationError(
            f"signal payload is not JSON-serialisable ({type(value).__name__}): {exc}"
        ) from None


def _state_from_memo(memo: Any) -> dict[str, Any]:
    """What a redrive needs, rebuilt from an active run's memo (step ledgers are not in it:
    the re-pinned stage starts its steps afresh)."""
    info = RunMemo.model_validate(memo["wfe_run"])
    done = sorted(
        (s for s in info.stages if s.status == "completed"), key=lambda s: s.finished_at or ""
    )
    order = {s.id: i + 1 for i, s in enumerate(done)}
    stages: dict[str, dict[str, Any]] = {}
    for s in info.stages:
        stages[s.id] = {**s.to_json(), "order": order.get(s.id), "steps": {}, "events": []}
    return {
        "input": info.input,
        "idempotency_key": info.idempotency_key,
        "fingerprint": memo.get("wfe_fp"),
        "created_at": info.created_at,
        "redrive": info.redrive_count,
        "event_seq": info.event_seq,
        "stages": stages,
        "signals": [],
        "signal_keys": [],
        "run_started": info.run_started,
    }


@asynccontextmanager
async def in_background(work: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    """Run ``work`` (a worker's periodic loop) as a task while the block runs; cancel it at
    the end."""
    task = asyncio.create_task(work, name=name)
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
