"""The closing event of a run Temporal ended outside the engine, published by the workers.

An operator's ``temporal workflow terminate`` (the Web UI's Terminate, a reset's terminate of
the old execution) or a workflow execution timeout closes the execution without a workflow task:
the run could not emit its ``run.failed`` event, nor write its ``WfeStatus`` (it keeps the active
status it last wrote). ``get_run`` reads such a run as ``failed`` (``TemporalEngine.
_ended_outside``); this module makes the event stream say it too, as the native driver's does
for every run that ends.

While a worker runs (``noticing``), every ``SCAN_EVERY_S`` it lists (a visibility query, pages
of ``PAGE_SIZE`` with a pause between them, at most ``MAX_PER_PASS`` runs announced a pass) the
executions of its task queues that Temporal closed as ``Terminated``/``TimedOut`` while their
``WfeStatus`` was still active, and for each one not announced yet publishes the run's
``run.failed`` event: the id the run's own would have had (``Lifecycle(run, redrive)``, so one
id per run and redrive whoever sends it), the next sequence number after the events the
execution emitted (replayed from its history, ``emitted_seq``: with those of the workflow task
the close interrupted, which the worker running it may have delivered; the memo, written by
completed tasks only, lags them), the error ``get_run`` reports
(``RunTerminatedError`` with the operator's reason, ``RunTimeoutError``). It goes the way a
run's last events go (``RunEnds.deliver_outside``): delivered to the sink after any events kept
for the run, or kept in the BlobStore (no sink, a failing sink) and retried with the outbox's
rule, then dead-lettered. Then a marker (``ended_key``, under the run's blob folder: purge
deletes it with the run) records it, so later passes skip the run; a worker that dies in
between, or two workers racing, deliver it again with the same id (at least once). An execution
that is not its run's latest any more (redriven since) gets only the marker: the redrive's
``run.redriven`` already follows, and a late ``run.failed`` would come after it.

The first pass of a worker lists every such execution; later ones only those closed since the
previous pass began (less ``_LAG_S`` for the visibility store's lag).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pydantic_core
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.service import RPCError

from engine_port import BlobStore, ErrorInfo, Lifecycle

from ._helpers import _ACTIVE, _quote, in_background
from ._history_events import replay_events
from ._journal import put_small
from ._state import RunMemo
from ._wire import _safe

if TYPE_CHECKING:
    from ._engine import TemporalEngine

__all__ = ["EndedOutside", "announced", "announced_seq", "emitted_seq", "ended_key", "noticing"]

log = logging.getLogger("wfe.worker")

SCAN_EVERY_S = 30.0
"""How often a worker looks for runs Temporal ended outside the engine."""
PAGE_SIZE = 50  # executions per visibility page
PAGE_PAUSE_S = 0.2  # between two pages of one pass
MAX_PER_PASS = 50  # runs announced per pass (the rest: next pass)
_LAG_S = 300.0  # how far before the previous pass a later pass looks (visibility lag)
_DELIVER_WITHIN_S = 10.0  # how long the sink gets before the event is kept and retried


def ended_key(run_id: str, execution_id: str) -> str:
    """The marker saying the closing event of one execution of the run was published."""
    return f"runs/{_safe(run_id)}/ended-outside/{_safe(execution_id)}.json"


async def announced(store: BlobStore, run_id: str) -> list[dict[str, Any]]:
    """The closing events workers published for the run's executions (``engine.events``
    lists them with the events its histories replay)."""
    out = []
    for key in await store.list(f"runs/{_safe(run_id)}/ended-outside/"):
        with suppress(Exception):  # (deleted meanwhile: a purge)
            record = pydantic_core.from_json(await store.get(key))
            if isinstance(record.get("event"), dict):
                out.append(record["event"])
    return out


async def announced_seq(store: BlobStore, run_id: str) -> int:
    """The sequence number of the last closing event a worker published for the run's
    executions (0: none), which a redrive's events follow."""
    return max((int(e.get("seq") or 0) for e in await announced(store, run_id)), default=0)


async def emitted_seq(client: Client, run_id: str, execution_id: str | None = None) -> int:
    """The sequence number of the last event an execution of the run (``execution_id``; None:
    its latest) emitted, replayed from its history (``_history_events.emitted``: for one
    Temporal closed outside a workflow task, with the events of the task the close
    interrupted, which may have reached the sink). 0: none, or the history does not replay
    on this code (the memo's count stands)."""
    try:
        history = await client.get_workflow_handle(run_id, run_id=execution_id).fetch_history()
        events = await replay_events([history], client.data_converter)
    except Exception:
        log.warning("run %s: its history did not replay", run_id, exc_info=True)
        return 0
    return max((e.seq for e in events), default=0)


class EndedOutside:
    """Announces the runs of ``task_queues`` that Temporal ended outside the engine."""

    def __init__(self, engine: TemporalEngine, task_queues: list[str]) -> None:
        self.engine = engine
        self.task_queues = sorted(set(task_queues))
        self._done: set[str] = set()  # executions announced (or skipped) by this worker
        self._since: datetime | None = None  # the start of the previous pass

    def _query(self, since: datetime | None) -> str:
        queues = ", ".join(f"'{_quote(tq)}'" for tq in self.task_queues)
        active = ", ".join(f"'{s}'" for s in _ACTIVE)
        query = (
            f"TaskQueue IN ({queues}) AND ExecutionStatus IN ('Terminated', 'TimedOut') "
            f"AND WfeStatus IN ({active})"
        )
        if since is not None:
            cutoff = (since - timedelta(seconds=_LAG_S)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            query += f" AND CloseTime >= '{cutoff}'"
        return query

    async def scan(self) -> int:
        """One pass; returns how many closing events it published."""
        if not self.task_queues:
            return 0
        began = datetime.now(UTC)
        pages = self.engine._conn.list_workflows(self._query(self._since), page_size=PAGE_SIZE)
        sent = 0
        complete = True
        while True:
            await pages.fetch_next_page(page_size=PAGE_SIZE)
            for ex in pages.current_page or []:
                if ex.run_id in self._done:
                    continue
                if sent >= MAX_PER_PASS:
                    complete = False
                    break
                if await self._announce(ex):
                    sent += 1
                self._done.add(ex.run_id)
            if not complete or not pages.next_page_token:
                break
            await asyncio.sleep(PAGE_PAUSE_S)
        if complete:
            self._since = began
        return sent

    async def _announce(self, ex: WorkflowExecution) -> bool:
        """Publish the closing event of the execution ``ex`` unless it was; True if sent."""
        eng = self.engine
        store = eng.blob_store
        run_id = ex.id
        marker = ended_key(run_id, ex.run_id)
        if await store.has(marker):
            return False
        info = (await ex.memo()).get("wfe_run")
        if not isinstance(info, dict):
            return False  # not a run of this engine's
        run = RunMemo.model_validate(info)
        if run.status not in _ACTIVE:
            return False  # it recorded its end itself
        latest = (await eng._describe_raw(run_id)).workflow_execution_info.execution.run_id
        if latest != ex.run_id:
            # redriven since: its run.redriven follows; a run.failed now would come after it
            await put_small(store, marker, pydantic_core.to_json({"skipped": "redriven"}))
            return False
        status = ex.status or WorkflowExecutionStatus.TERMINATED
        error = (await eng._ended_outside({"stages": []}, status, run_id))["error"]
        # after every event the execution emitted, those of the task the close interrupted
        # too (the sink may have them; the memo's count, from completed tasks, may not)
        seq = max(run.event_seq, await emitted_seq(eng._conn, run_id, ex.run_id)) + 1
        draft = Lifecycle(run_id, run.redrive_count).run_failed(ErrorInfo(**error))
        at = ex.close_time or datetime.now(UTC)
        event = draft.at_seq(run_id, run.workflow_id, seq, at).model_dump(mode="json")
        settings = eng.settings
        rule = {
            "dead_after": settings.dead_letter_after,
            "dead_min_s": settings.outbox_dead_letter_min_seconds,
            "retry_initial_s": settings.outbox_retry_initial_seconds,
            "retry_max_s": settings.outbox_retry_max_seconds,
        }
        await eng._ends.deliver_outside(run_id, [event], rule, _DELIVER_WITHIN_S)
        record = {"event_id": event["id"], "seq": seq, "execution": ex.run_id, "event": event}
        await put_small(store, marker, pydantic_core.to_json(record))
        log.info("run %s ended in Temporal as %s: published its run.failed", run_id, status.name)
        return True


@asynccontextmanager
async def noticing(engine: TemporalEngine, task_queues: list[str]) -> AsyncIterator[None]:
    """While a worker runs: announce the runs of ``task_queues`` Temporal ended outside the
    engine, every ``SCAN_EVERY_S``."""
    ended = EndedOutside(engine, task_queues)

    async def loop() -> None:
        while True:
            try:
                await ended.scan()
            except RPCError:
                log.warning("ended runs: Temporal did not answer; trying again later")
            except Exception:
                log.warning("ended runs: a pass failed; trying again later", exc_info=True)
            await asyncio.sleep(SCAN_EVERY_S)

    async with in_background(loop(), "wfe-ended-outside"):
        yield
