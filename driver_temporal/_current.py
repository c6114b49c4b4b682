"""The current ``wfe_run`` memo of a run whose memo lags (``RunMemo.stages_lag``).

Runs started since 2026-12-02 (``StartDocument.memo_on_change``) write their memo only when
what a reader of the memo alone acts on changes: their status, a stage they wait or failed
in, a freeze, their end. Not at every stage that starts or completes: each write is a
visibility upsert the server persists and indexes, most of the server CPU a short run cost
beyond a hand-written workflow. The memo's status is always current; its stages are those
of its last write while the run is active. ``get_run`` (and a redrive of a run an operator
ended) reads the current ones:

- from the run itself while it runs: the ``run_info`` query, which a worker serving the run
  answers from its cache (the state its last completed workflow task left);
- else (no worker answered within ``_ASK_ALONE_S``, or the execution was terminated or timed
  out) from its history, replayed here on the driver's workflow code
  (``_history_events.replay_info``): the same answer with no worker, for a read and a replay
  of the history; the query still counts if it answers first. (A query to a task queue whose
  worker just stopped waits its whole timeout: 5 s of ``get_run`` before this.)

Listings (``list_runs``) read the memo alone: an active run's stages there are those of its
last status change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.service import RPCError

from ._helpers import _ACTIVE
from ._history_events import replay_info
from ._names import RUN_INFO_QUERY

__all__ = ["current_memo"]

_ASK_ALONE_S = 0.5  # how long the query alone may take before the history is replayed too


async def current_memo(
    client: Client,
    run_id: str,
    memo: dict[str, Any],
    status: WorkflowExecutionStatus | None,
    *,
    ask_s: float,
) -> dict[str, Any]:
    """``memo`` (a run's memo entries) with its current ``wfe_run`` when the entry lags;
    ``ask_s``: how long a worker may take to answer the query."""
    run = memo.get("wfe_run") or {}
    if not run.get("stages_lag") or run.get("status") not in _ACTIVE:
        return memo
    if status == WorkflowExecutionStatus.RUNNING:
        fresh = await _first(_asked(client, run_id, ask_s), lambda: _replayed(client, run_id))
    else:
        fresh = await _replayed(client, run_id)
    if not isinstance(fresh, dict) or fresh.get("id") != run.get("id"):
        return memo  # (nothing better: the memo as written)
    return {**memo, "wfe_run": fresh}


async def _first(
    asked: Coroutine[Any, Any, dict[str, Any] | None],
    replayed: Callable[[], Coroutine[Any, Any, dict[str, Any] | None]],
) -> dict[str, Any] | None:
    """The query's answer; once it has taken ``_ASK_ALONE_S``, the first answer of the query
    and the replay."""
    ask = asyncio.ensure_future(asked)
    try:
        await asyncio.wait({ask}, timeout=_ASK_ALONE_S)
        if ask.done() and ask.result() is not None:
            return ask.result()
        replay = asyncio.ensure_future(replayed())
        try:
            waiting = {replay} if ask.done() else {replay, ask}
            while waiting:
                ended, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for answer in ended:
                    if answer.result() is not None:
                        return answer.result()
            return None
        finally:
            replay.cancel()
    finally:
        ask.cancel()


async def _asked(client: Client, run_id: str, ask_s: float) -> dict[str, Any] | None:
    handle = client.get_workflow_handle(run_id)
    try:
        info = await handle.query(
            RUN_INFO_QUERY, result_type=dict, rpc_timeout=timedelta(seconds=ask_s)
        )
    except (WorkflowQueryFailedError, WorkflowQueryRejectedError, RPCError):
        return None
    return info if isinstance(info, dict) and info else None


async def _replayed(client: Client, run_id: str) -> dict[str, Any] | None:
    try:
        history = await client.get_workflow_handle(run_id).fetch_history()
    except RPCError:
        return None
    return await replay_info(history, client.data_converter)
