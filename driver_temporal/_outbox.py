"""The run's event outbox (a base of ``_workflow.GraphWorkflow``): how its events reach the
EventSink.

The workflow builds every event (``_emit``: same ids, same sequence numbers as the native
driver) and keeps it in ``_outbox`` until a delivery is confirmed. Runs started with
``events_via = "activities"`` in their start document deliver them without a local activity in
every workflow task:

- a stage activity (attempt or compensation, regular or ``local=True``) scheduled while the
  outbox holds events *carries* them, from the oldest unconfirmed one on (in its input's
  metadata, ``publish``; on runs marked ``events_via = "one-carrier"``, the default since
  2026-12-01 evening, only while no other carrying activity is in flight: the siblings of a
  fan-out carry nothing), and publishes them while its stage body runs; its result (or its
  failure's details) says up to which sequence number they were delivered (``published``),
  and the workflow drops them. In a linear graph the events of a stage's completion and the
  next stage's start ride with the next stage's activity.
- events no activity in flight carries (a stage that suspended, a sibling that completed while
  another runs) are published at the end of the activation by the ``wfe.publish`` local
  activity, as before, or, on runs marked ``publish = "worker"`` (the default since
  2026-12-03), handed to the worker running the task (``_hand_over``), which delivers them (or
  keeps them in the BlobStore) before the task completes, with no local activity: a 1 -> 50 ->
  1 fan-out ran ~8 of them; the run's last events (its end) ride with ``wfe.save_state``, the one
  local activity of its last workflow task, or, on runs marked ``run_end = "worker"`` (the
  default since 2026-12-02 evening), are delivered by the worker running that task before it
  completes, with no local activity (``_record_end``, ``_run_end``).
- on a worker with no sink, an activity of a run marked ``parking = "when-slow"`` (since
  2026-12-02) parks a small carried batch (``LAZY_MAX`` events) only once its stage has run
  ``_activities.PARK_AFTER_S``; a stage that ends sooner hands the batch back unparked (not
  confirmed), the next activity carries it again with its own events, and the run's end
  (``wfe.save_state``) or its next pause (``wfe.publish``) parks what is left: a chain of fast
  stages writes one blob at its end instead of one per stage.

Every batch starts at the oldest unconfirmed event and keeps sequence order, so the first
delivery of each event comes after the first delivery of every earlier one (per-run order;
a carried batch delivered twice, by the activity and by a later batch, is a duplicate:
delivery is at least once, deduplicated by id). A carried publish that fails only leaves its
events unconfirmed: the ``wfe.publish`` path delivers them with the native outbox's retry and
dead-letter rule. Runs started before keep publishing every activation's events through
``wfe.publish`` (their histories replay unchanged).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from engine_port import EventDraft
    from engine_port.driver import sink_retry_delay

    from ._carry import compact
    from ._clock import RunClock
    from ._names import EVENTS_HANDED, RUN_ENDED

__all__ = ["CARRY_MAX", "LAZY_MAX", "EventOutbox", "WorkerFault"]

CARRY_MAX = 200  # events per batch, carried or published
LAZY_MAX = 32  # a carried batch up to this size may be handed back unparked (``parking``)
_LOCAL_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3)


class WorkerFault(RuntimeError):
    """The worker running a workflow task could not do what the task handed it (its BlobStore
    or event loop failed or was too slow). Raised from the workflow, it fails the workflow
    *task*, which Temporal runs again: an infrastructure fault never fails the run (DESIGN §5).
    (The worker's own error is not raised as is: temporalio fails the whole workflow on a
    ``TimeoutError``, and a replay, which calls no worker, would not fail it again.)"""


class EventOutbox(RunClock):
    """The outbox and its publisher; ``GraphWorkflow`` sets the attributes below. Events
    take the run's time (``_clock.RunClock._now``)."""

    _run_id: str
    _wf_id: str
    _seq: int
    _outbox: list[dict[str, Any]]
    _closing: bool
    _parked: bool
    _dead_after: int
    _dead_min_s: float
    _retry_initial_s: float
    _retry_max_s: float
    # runs whose activities carry their events (``events_via`` in the start document)
    _via_activities: bool = False
    # ... one carrying activity in flight at a time (``events_via = "one-carrier"``)
    _one_carrier: bool = False
    # ... whose small batches a sinkless worker parks only for a slow stage (``parking``)
    _park_when_slow: bool = False
    # ... whose events no activity carries are handed to the worker (``publish``)
    _hands_events: bool = False
    # ... a hand-over that failed: raised from the workflow's top-level coroutine (``_watched``)
    _broken: Exception | None = None
    # while the run's end is recorded: its last events ride with ``wfe.save_state``
    _finishing: bool = False

    def _init_outbox(self) -> None:
        # the activities in flight that carry events: id -> (last seq carried, parked flag)
        self._carriers: dict[int, tuple[int, bool]] = {}
        self._carrier_ids = 0

    async def _settled(self) -> None:
        raise NotImplementedError

    def _continuing(self) -> bool:
        raise NotImplementedError

    def _emit(self, draft: EventDraft) -> None:
        self._seq += 1
        at = self._now()
        event = draft.at_seq(self._run_id, self._wf_id, self._seq, at).model_dump(mode="json")
        self._outbox.append(event)
        self._stamp(event, at)

    # -- carried by activities ----------------------------------------------------------------
    def _carry_events(self, task: dict[str, Any]) -> int | None:
        """Hand the unconfirmed events (oldest first) to the activity about to be scheduled
        with ``task``; returns its carrier id (None: nothing carried)."""
        if not self._via_activities or not self._outbox:
            return None
        if self._one_carrier and self._carriers:
            # siblings scheduled with the carrier (a fan-out) carry nothing, or each would
            # deliver the growing batch from the oldest event again (20 siblings: 256
            # deliveries of 47 events); what it does not carry, ``_publisher`` publishes at
            # the end of the activation
            return None
        events = list(self._outbox[:CARRY_MAX])
        task["publish"] = {"events": [compact(e) for e in events], "parked": self._parked}
        if self._park_when_slow and len(events) <= LAZY_MAX:
            task["publish"]["lazy"] = True
        self._carrier_ids += 1
        self._carriers[self._carrier_ids] = (int(events[-1]["seq"]), self._parked)
        return self._carrier_ids

    def _carrier_done(self, carrier: int | None, published: Any) -> None:
        """The activity of ``carrier`` reported (``published``: what it delivered, or None
        when it ended without a result): delivered events leave the outbox; any other is
        published by ``_publisher``."""
        if carrier is None:
            return
        _, told_parked = self._carriers.pop(carrier, (0, False))
        if isinstance(published, dict):
            self._confirm(published, told_parked)

    def _confirm(self, published: dict[str, Any], told_parked: bool) -> None:
        if not published.get("ok"):
            return
        self._drop_upto(int(published.get("upto") or 0))
        parked = bool(published.get("parked"))
        # a worker told of parked events delivered them first; one that was not leaves them
        self._parked = parked if told_parked else (self._parked or parked)

    def _drop_upto(self, seq: int) -> None:
        if self._outbox and self._outbox[0]["seq"] <= seq:
            self._outbox = [e for e in self._outbox if e["seq"] > seq]

    def _due(self) -> bool:
        """Whether ``_publisher`` has events to publish: any, on runs of the older rule;
        events no activity in flight carries, otherwise (not while the run's end is
        recorded: ``wfe.save_state`` takes them)."""
        if not self._outbox:
            return False
        if not self._via_activities:
            return True
        if self._finishing:
            return False
        covered = max((seq for seq, _ in self._carriers.values()), default=0)
        return int(self._outbox[-1]["seq"]) > covered

    def _last_events(self) -> list[Any]:
        """The arguments ``wfe.save_state`` adds for the run's last events (none on runs of
        the older rule, whose call stays as it was)."""
        if not self._via_activities:
            return []
        return [list(self._outbox[:CARRY_MAX]), self._parked]

    # -- recorded by the worker at the run's end ----------------------------------------------
    def _record_end(self, state: dict[str, Any]) -> None:
        """(Runs marked ``run_end = "worker"``.) Have the worker running this last workflow
        task store the run's final ``state`` and deliver its last events before the task
        completes (its ``RUN_ENDED`` extern function, ``_run_end``); a replay has nothing done
        (they were). Either way the events leave the outbox: from here on the worker answers
        for them (retries, dead letters). A worker without the function (not this driver's),
        or a store that fails, fails the workflow task, which Temporal retries."""
        events, self._outbox = self._outbox, []
        self._finishing = False
        record = self._worker_function(RUN_ENDED, "record the end")
        if record is not None:
            try:
                record(self._run_id, state, events, self._parked, self._rule())
            except Exception as exc:
                raise _fault(f"record the end of run {self._run_id!r}", exc) from exc

    def _worker_function(self, name: str, what: str) -> Callable[..., None] | None:
        """The extern function ``name`` of the worker running this workflow task (None on a
        replay: what it does was done); a worker without it (not this driver's) fails the
        task, which Temporal hands to another."""
        if workflow.unsafe.is_replaying():
            return None
        fn: Callable[..., None] | None = workflow.extern_functions().get(name)
        if fn is None:
            raise WorkerFault(
                f"this worker cannot {what} of run {self._run_id!r}: run it on a worker the "
                "wfe Temporal driver builds (engine.worker())"
            )
        return fn

    def _rule(self) -> dict[str, float]:
        return {
            "dead_after": self._dead_after,
            "dead_min_s": self._dead_min_s,
            "retry_initial_s": self._retry_initial_s,
            "retry_max_s": self._retry_max_s,
        }

    # -- handed to the worker while the run runs ----------------------------------------------
    def _hand_over(self) -> bool:
        """(Runs marked ``publish = "worker"``.) Have the worker running this workflow task
        deliver the outbox (or keep it in the BlobStore, retried in the background) before
        the task completes (its ``EVENTS_HANDED`` extern function, ``_run_end``), as at the
        run's end: no command, no local activity. The events leave the outbox (a replay has
        nothing done: they were); the run then counts on kept events until an activity that
        carries events says there are none (``_parked``), so that each later batch is
        delivered after them. A hand-over that fails keeps them and returns False: the
        workflow task fails (``GraphWorkflow._watched``) and Temporal runs it again."""
        events, self._outbox = self._outbox, []
        parked, self._parked = self._parked, True
        try:
            hand = self._worker_function(EVENTS_HANDED, "deliver the events")
            if hand is not None:
                hand(self._run_id, events, parked, self._rule())
        except Exception as exc:
            # (this task's error would fail nothing: ``_watched`` raises it, failing the
            # workflow task, whose next try runs this activation again, events and all)
            self._outbox, self._parked = events, parked
            self._broken = _fault(f"deliver the events of run {self._run_id!r}", exc)
            return False
        return True

    # -- published by the workflow ------------------------------------------------------------
    async def _publisher(self) -> None:
        """Deliver the outbox in order; a failing sink is retried with backoff, and a batch is
        dead-lettered after ``dead_letter_after`` failures spanning at least the minimum time
        since its first failure (the native outbox's rule)."""
        failures = 0
        first_failure = workflow.now()
        while True:
            await workflow.wait_condition(
                lambda: (self._due() and not self._continuing()) or self._closing
            )
            await self._settled()
            if not self._outbox:
                if self._closing:
                    return
                continue
            if not (self._due() or self._closing):
                continue  # an activity scheduled meanwhile carries them
            if not self._closing and self._continuing():
                continue  # the run continues as new: they ride to the new execution
            if self._hands_events:
                if not self._hand_over():
                    return  # (``_watched`` fails the workflow task)
                continue
            batch = list(self._outbox[:CARRY_MAX])
            try:
                res = await workflow.execute_local_activity(
                    "wfe.publish",
                    args=[batch, self._parked],
                    result_type=dict,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=_LOCAL_RETRY,
                )
                ok = bool(res.get("ok"))
            except ActivityError:
                ok = False
            if ok:
                self._parked = bool(res.get("parked"))
                self._drop_upto(int(batch[-1]["seq"]))
                failures = 0
                continue
            failures += 1
            if failures == 1:
                first_failure = workflow.now()
            spanned = (workflow.now() - first_failure).total_seconds()
            if failures >= self._dead_after and spanned >= self._dead_min_s:
                try:
                    await workflow.execute_local_activity(
                        "wfe.dead_letter",
                        batch,
                        start_to_close_timeout=timedelta(seconds=30),
                        retry_policy=_LOCAL_RETRY,
                    )
                    self._drop_upto(int(batch[-1]["seq"]))
                    failures = 0
                    continue
                except ActivityError:
                    pass
            delay = sink_retry_delay(failures, self._retry_initial_s, self._retry_max_s)
            await workflow.sleep(delay, summary="event sink retry")


def _fault(what: str, exc: Exception) -> WorkerFault:
    if isinstance(exc, WorkerFault):
        return exc
    return WorkerFault(f"the worker could not {what}: {type(exc).__name__}: {exc}")
