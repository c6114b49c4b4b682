"""The end of a run, recorded by the worker whose workflow task decides it: no local activity
in a run's last workflow task (issue 13: a local activity's round trip through the SDK's core
was most of what the signal round trip and ``local=True`` runs lost to hand-written Temporal).

Runs marked ``run_end = "worker"`` (``StartDocument.ends_on_worker``) call the worker's
``RUN_ENDED`` extern function (temporalio's per-worker ``unsafe_extern_functions``, like
``_waiters``) from their last workflow task, when it is not a replay. ``RunEnds.record`` runs on
the workflow's thread and returns once, on the worker's event loop, the run's final state is
stored (``runs/<run>/state.json``, what a redrive reads) and its last events are delivered to the
sink, or kept in the BlobStore (``outbox/<run>/``) when the worker has no sink or the sink fails.
Only then does the task's completion (the run's end) go to Temporal, so the events are recorded
before the end is: a worker that dies in between leaves the task to another worker, which runs
the last activation again (not a replay) and records them again (at least once, as with the
local activity before). A store that fails raises into the workflow task, which Temporal
retries.

The call issues no command and the workflow never reads what it did, so the workflow stays
deterministic; from the call on the worker answers for the events: a sink that failed is retried
in the background with the native outbox's rule (backoff, then dead letters after
``dead_letter_after`` failures spanning the minimum time), and events still kept when the
worker stops reach the sink with the next ``flush_events()`` of an engine that has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pydantic_core
from temporalio.worker import (
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from engine_port import FolderBlobStore
from engine_port.driver import sink_retry_delay

from ._activities import DriverActivities, in_order, parked_events
from ._journal import put_small, writes_now
from ._names import DELIVERY_DECIDED, EVENTS_HANDED, RUN_ENDED, SIGNAL_STORED
from ._waiters import DeliveryWaiters
from ._wire import outbox_batch_key, outbox_prefix, state_key

__all__ = ["RunEnds", "WorkerExterns"]

# how long a run's last workflow task waits for the sink before it keeps the events in the
# BlobStore (the SDK fails a workflow task whose activation takes over 2 s as a deadlock)
_DELIVER_WITHIN_S = 1.0
_RECORD_WITHIN_S = 1.8
_HAND_WITHIN_S = 0.5  # ... and for the events of a running run (``hand``)


class RunEnds:
    """Records the end of the runs an engine's workers finish (one per engine)."""

    def __init__(self, acts: DriverActivities) -> None:
        self._acts = acts
        self._retries: dict[str, asyncio.Task[None]] = {}  # run id -> its sink retry

    def record(
        self,
        loop: asyncio.AbstractEventLoop,
        run_id: str,
        state: dict[str, Any],
        events: list[dict[str, Any]],
        parked: bool,
        rule: dict[str, float],
    ) -> None:
        """(The extern function, bound to the worker's ``loop``; called on the workflow's
        thread.) Store the run's final state and deliver or keep its last events; raises when
        the BlobStore fails (the workflow task fails and is retried)."""
        if self._kept_here(run_id, state, events):
            return
        done = asyncio.run_coroutine_threadsafe(
            self._record(run_id, state, events, parked, rule, _DELIVER_WITHIN_S), loop
        )
        try:
            done.result(_RECORD_WITHIN_S)
        except TimeoutError:
            done.cancel()
            raise

    def hand(
        self,
        loop: asyncio.AbstractEventLoop,
        run_id: str,
        events: list[dict[str, Any]],
        parked: bool,
        rule: dict[str, float],
    ) -> None:
        """(The ``EVENTS_HANDED`` extern function, bound to the worker's ``loop``; called on
        the workflow's thread.) Deliver or keep the events a running run's workflow task
        hands over, as ``record`` does its last ones (with a shorter wait for the sink: a
        workflow task may hand events over and end its run in one activation, which the SDK
        fails as a deadlock past 2 s); raises when the BlobStore fails."""
        if self._kept_here(run_id, None, events):
            return
        done = asyncio.run_coroutine_threadsafe(
            self._record(run_id, None, events, parked, rule, _HAND_WITHIN_S), loop
        )
        try:
            done.result(_RECORD_WITHIN_S - _DELIVER_WITHIN_S)
        except TimeoutError:
            done.cancel()
            raise

    def _kept_here(
        self, run_id: str, state: dict[str, Any] | None, events: list[dict[str, Any]]
    ) -> bool:
        """What ``_record`` does for a worker without a sink, done on the calling (workflow)
        thread when every blob is one ``put_small`` writes there (a folder store): the state,
        then the events kept as one batch, as ``deliver`` keeps them. The hop to the worker's
        event loop and back cost the run's last workflow task ~0.25 ms of its ~2 ms (more
        while the loop is busy); False (nothing written): ``_record`` does it on the loop."""
        acts = self._acts
        store = acts.claim.store
        if acts.sink is not None:
            return False
        blobs: list[tuple[str, bytes]] = []
        if state is not None:
            blobs.append((state_key(run_id), pydantic_core.to_json(state)))
        if events:
            key = outbox_batch_key(events[0]["run_id"], events[0]["seq"], events[-1]["seq"])
            blobs.append((key, pydantic_core.to_json(events)))
        if not all(writes_now(store, data) for _, data in blobs):
            return False
        assert isinstance(store, FolderBlobStore)
        for key, data in blobs:
            store.put_now(key, data)
        return True

    async def deliver_outside(
        self, run_id: str, events: list[dict[str, Any]], rule: dict[str, float], within_s: float
    ) -> None:
        """Deliver or keep (and retry with ``rule``) events of a run that Temporal ended
        outside the engine (``_ended``), after any events kept for it, as a run's last events
        are; raises when the BlobStore fails."""
        await self._record(run_id, None, events, True, rule, within_s)

    def store_signal(self, loop: asyncio.AbstractEventLoop, key: str, data: bytes) -> None:
        """(The ``SIGNAL_STORED`` extern function, bound to the worker's ``loop``; called on
        the workflow's thread.) Store an operator's signal payload too large to queue inline
        under ``key``; raises when the BlobStore fails (the workflow task fails and is
        retried, and the signal with it)."""
        done = asyncio.run_coroutine_threadsafe(self._acts.claim.store.put(key, data), loop)
        try:
            done.result(_RECORD_WITHIN_S)
        except TimeoutError:
            done.cancel()
            raise

    async def _record(
        self,
        run_id: str,
        state: dict[str, Any] | None,
        events: list[dict[str, Any]],
        parked: bool,
        rule: dict[str, float],
        within_s: float,
    ) -> None:
        acts = self._acts
        store = acts.claim.store
        if state is not None:
            await put_small(store, state_key(run_id), pydantic_core.to_json(state))
        if not events:
            return
        if acts.sink is None:
            await acts.deliver(events, parked, count_failures=False)  # kept in the store
            return
        try:
            res = await asyncio.wait_for(
                acts.deliver(events, parked, count_failures=True), within_s
            )
        except TimeoutError:
            res = {"ok": False, "error": f"TimeoutError: the sink took over {within_s:g} s"}
            acts.stats.refused(res["error"], len(events))
        if res.get("ok"):
            return
        error = str(res.get("error"))
        # kept (after any kept before, which stay): the retry delivers them all in order
        key = outbox_batch_key(run_id, int(events[0]["seq"]), int(events[-1]["seq"]))
        await put_small(store, key, pydantic_core.to_json(events))
        if run_id not in self._retries:
            task = asyncio.get_running_loop().create_task(self._retry(run_id, rule, error))
            self._retries[run_id] = task
            task.add_done_callback(lambda _: self._retries.pop(run_id, None))

    async def _retry(self, run_id: str, rule: dict[str, float], error: str) -> None:
        """Deliver the events kept for ``run_id`` once the sink takes them, with the native
        outbox's rule (the first failure, ``error``, was the run's end)."""
        acts = self._acts
        store = acts.claim.store
        failures, first_failure = 1, time.monotonic()

        def dead() -> bool:
            spanned = time.monotonic() - first_failure
            return failures >= rule["dead_after"] and spanned >= rule["dead_min_s"]

        while True:
            if not dead():
                delay = sink_retry_delay(failures, rule["retry_initial_s"], rule["retry_max_s"])
                await asyncio.sleep(delay)
            # the run's kept events, held while they are read, published or given up, and
            # deleted: a flush_events() delivering them meanwhile waits, then finds them gone
            # (or went first, and this finds none); and they are given up right after the
            # failure that makes them dead, never on a decision taken before the sink came back
            async with acts.kept.holding(run_id):
                try:
                    keys = await store.list(outbox_prefix(run_id))
                    batch = in_order(await parked_events(store, keys))
                except Exception:  # (another process's deliverer took some meanwhile)
                    continue
                if not batch:
                    return
                if not dead():
                    res = await acts.publish_batch(batch, keys)
                    if res["ok"]:
                        return
                    error = str(res["error"])
                    failures += 1
                    if not dead():
                        continue
                acts.stats.last_error = error  # (what the dead letters are reported with)
                await acts.dead_letter(batch)
                for k in keys:
                    await store.delete(k)
                return

    async def aclose(self) -> None:
        """Stop the retries (their events stay kept: ``flush_events()`` delivers them)."""
        tasks = list(self._retries.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


class WorkerExterns(Interceptor):
    """Gives the workflows of one worker its engine's extern functions: what became of a
    signal (``_waiters``), the recording of a run's end and events (above) and the storing
    of a large operator signal, bound to the worker's event loop (built on it)."""

    def __init__(self, waiters: DeliveryWaiters, ends: RunEnds) -> None:
        loop = asyncio.get_running_loop()
        self._decided: Callable[[Any, Any], None] = waiters.decided

        def ended(*args: Any) -> None:
            ends.record(loop, *args)

        self._ended = ended

        def handed(*args: Any) -> None:
            ends.hand(loop, *args)

        self._handed = handed

        def stored(*args: Any) -> None:
            ends.store_signal(loop, *args)

        self._stored = stored

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        input.unsafe_extern_functions[DELIVERY_DECIDED] = self._decided
        input.unsafe_extern_functions[RUN_ENDED] = self._ended
        input.unsafe_extern_functions[EVENTS_HANDED] = self._handed
        input.unsafe_extern_functions[SIGNAL_STORED] = self._stored
        return None
