"""The activities: one dynamic activity runs stage attempts (type = stage id) and
compensations (type = ``<stage>.compensate``) through ``engine_port.StageRunner``; small named
activities publish events, dead-letter them, save a run's final state and read a step journal.
A stage attempt's activity that hears of a cancel asks its run whether a migration freeze sent
it (``wfe.internal.freeze_cancelled``, see ``_workflow``): then the body goes on (a running stage
is waited for), else the body sees the cancellation.

Crash survival of steps: every step record the StageRunner journals during an attempt is
appended to the step journal in the shared BlobStore
(``runs/<run>/steps/<stage>/r<redrive>/<stage|compensate>/journal.jsonl``, large results spilled
first; one constant-cost append per step, see ``_journal``) *before* the stage body continues,
so it is durable the moment the step returns. When the worker dies, Temporal notices the lost
heartbeat (heartbeats only carry liveness) and retries the activity on another worker with the
same stage attempt (a ``local=True`` stage: the workflow task times out, another worker replays
the history and runs the local activity again, at try 1, so local activities always read the
journal); that retry seeds its ledger from the journal, merged with the ledger the workflow
holds, so no step completed before the crash ever runs again (only the step that was running
when the worker died, whose record was never written, runs again). A signal the lost try
consumed stays consumed: the retry reports it to the workflow.

Signals: a stage attempt's task carries only the signals its run lent it (the one a resumed
wait is for; every free one for a ``local=True`` attempt). A wait whose name has none left there
asks the run (the ``wfe.internal.take_signal`` update, see ``_signals``) for the oldest free one
before the body suspends, so a signal buffered before the wait is reached (before the stage
started or while its body ran) is consumed by it without a ``stage.suspended``, as on the native
driver, and the stages of a parallel group take signals concurrently, each exactly once. The run
keeps what it handed out with the stage attempt until the attempt's result arrives (a retried try
asking for the same step gets the same signal). A ``local=True`` stage does not ask (it runs
inside the run's own workflow task): a wait with nothing lent suspends and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import pydantic_core
from temporalio import activity
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from engine_port import (
    Abandoned,
    BlobStore,
    ClaimCheck,
    Completed,
    Event,
    EventSink,
    Failed,
    InMemoryLedger,
    Outcome,
    Registry,
    StageRequest,
    StageRunner,
    StepRecord,
    Suspended,
)
from engine_port.driver import DeadLetteredEvent, DeadLetterLog, publish_to_sink
from engine_port.errors import EngineError, SpilledPayloadUnavailableError

from ._carry import META_KEY, carry, meta_of, whole
from ._journal import StepJournal, put_small, step_records
from ._names import FREEZE_CANCELLED_QUERY, TAKE_SIGNAL_UPDATE
from ._wire import (
    BLOB_KEYS_CASE_SAFE,
    dlq_key,
    journal_prefix,
    outbox_batch_key,
    outbox_prefix,
    record_from_json,
    record_to_json,
    spill_key,
    state_key,
)

__all__ = [
    "COMPENSATE_SUFFIX",
    "FREEZE_CANCELLED_QUERY",
    "READ_JOURNAL_ACTIVITY",
    "TAKE_SIGNAL_UPDATE",
    "DriverActivities",
    "EventStats",
]

COMPENSATE_SUFFIX = ".compensate"
READ_JOURNAL_ACTIVITY = "wfe.read_journal"
T = TypeVar("T")
# RPC outcomes of a take that say nothing about the run (a busy server or worker): ask again
# (``spill`` in ``_run``) the bytes of step values a stage's ledger carries inline, and the
# size a value keeps inline past that (its reference would be about as big)
_STEPS_INLINE = 500_000
_STEP_KEPT_INLINE = 512
_TRANSIENT = frozenset(
    {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.RESOURCE_EXHAUSTED}
)


_log = logging.getLogger("wfe.outbox")


@dataclass
class EventStats:
    """Delivery counters since the last ``flush_events()``."""

    delivered: int = 0
    failed: int = 0
    dead: int = 0
    error: str | None = None  # the sink's first error since the last flush_events()
    last_error: str | None = None  # the sink's latest error, kept across flushes

    def refused(self, error: str, events: int = 0) -> None:
        """The sink refused a batch: ``events`` more failed (0: a failure another path counts,
        e.g. a carried batch that ``wfe.publish`` retries)."""
        self.failed += events
        self.error = self.error or error
        self.last_error = error

    def dead_lettered(self, events: int) -> None:
        """``events`` given up on (disjoint from ``failed``: the attempt that gave them up is not
        a retry pending). A dead letter always follows refusals, which a ``flush_events()``
        between them may have reported already: the one that reports the dead letters still
        says the sink is degraded, with its latest error."""
        self.dead += events
        self.failed = max(0, self.failed - events)
        self.error = self.error or self.last_error or "the event sink refused these events"

    def take(self) -> tuple[int, int, int]:
        out = (self.delivered, self.failed, self.dead)
        self.delivered = self.failed = self.dead = 0
        return out


class KeptLocks:
    """One deliverer at a time of the events kept for a run in this process (``outbox/<run>/``
    in the BlobStore): each reads the kept batches, publishes or dead-letters them and deletes
    them while holding the run's lock, so a retry that gives a batch up never dead-letters one
    a ``flush_events()`` has just delivered (a dead letter reported after the sink recovered)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # run -> lock, holders

    @contextlib.asynccontextmanager
    async def holding(self, run_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(run_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[run_id]


# asks the run for the oldest signal of a name this attempt was not given: (step key, name)
# -> (taken, payload)
TakeSignal = Callable[[str, str], Awaitable[tuple[bool, Any]]]


class _JournalLedger(InMemoryLedger):
    """An in-memory ledger that journals every new record (spilled) before returning, so a
    journaled step survives a crash of this worker (see ``_journal``).

    With ``take``, a wait whose signal is not among those the attempt was given at its start
    asks the run for it (``wfe.internal.take_signal``) before the body suspends; such a wait's
    record is journaled with ``"via": "take"`` so that a retry after a lost worker knows the
    signal came from the run, not from the queues in its task."""

    def __init__(
        self,
        records: dict[str, StepRecord],
        signals: dict[str, list[Any]],
        journal: dict[str, dict[str, Any]],
        spill: Any,
        log: StepJournal,
        take: TakeSignal | None = None,
    ) -> None:
        super().__init__(records, signals)
        self.journal = journal
        self._spill = spill
        self._log = log
        self._take = take
        self._taking: str | None = None

    async def put(self, record: StepRecord) -> None:
        data = await self._spill(record)
        await self._log.append({**data, "via": "take"} if self._taking == record.name else data)
        await super().put(record)
        self.journal[record.name] = data

    async def consume_signal(self, record: StepRecord) -> StepRecord | None:
        done = await super().consume_signal(record)
        if done is not None or self._take is None or record.signal is None:
            return done
        taken, payload = await self._take(record.name, record.signal)
        if not taken:
            return None
        done = record.done(payload)
        self._taking = record.name
        try:
            await self.put(done)
        finally:
            self._taking = None
        return done


@dataclass(frozen=True)
class _Recorded:
    """The result document of a local try that had ended, read back from its journal: its
    local activity runs again only because the workflow task that was to record it was lost
    (a lost worker, a task timeout, or a completion Temporal refused because a signal reached
    the run meanwhile), so the body does not run again."""

    doc: dict[str, Any]


def _outcome_name(info: activity.Info, task: dict[str, Any], compensation: bool) -> str | None:
    """The journal record of a local try's result document (``_Recorded``); None for a
    regular activity or a task of a run started before tries were numbered."""
    if not info.is_local or "try" not in task:
        return None
    # (a compensation's attempts are numbered apart from the stage's; it never suspends)
    return f"wfe.outcome.{'c' if compensation else 'a'}{task['attempt']}.t{task['try']}"


async def _journaled_by_lost_try(
    log: StepJournal,
    records: dict[str, dict[str, Any]],
    journal: dict[str, dict[str, Any]],
    raw_signals: dict[str, list[Any]],
    outcome: str | None,
) -> tuple[list[str], dict[str, Any] | None, list[tuple[str, str]]]:
    """Merge the steps a lost try of this attempt journaled into ``records`` (and this try's
    ``journal``); returns the signal names it consumed from the task's queues (it took the
    oldest of its name: it stays taken, removed from ``raw_signals``), the result document
    recorded as ``outcome`` by a try that ended, if any, and the waits (step key, signal
    name) that took a signal the task's queues do not hold (after an operator's reset the
    run holds it again: Temporal re-applied it; see ``_claim_after_reset``)."""
    pre_consumed: list[str] = []
    recorded: dict[str, Any] | None = None
    unclaimed: list[tuple[str, str]] = []
    latest: dict[str, dict[str, Any]] = {}
    for r in await log.read():
        if r.get("kind") == "outcome":
            if r["name"] == outcome:
                recorded = r["doc"]
            continue
        # the later record of a step wins (a timed wait is journaled pending, then done),
        # in the order the steps reached their last record
        latest.pop(r["name"], None)
        latest[r["name"]] = r
    for r in latest.values():
        via = r.pop("via", None)
        if records.get(r["name"]) == r:
            continue
        records[r["name"]] = r
        journal[r["name"]] = r
        if not record_from_json(r).took_signal:
            continue
        sig = str(r.get("signal"))
        if via != "take" and raw_signals.get(sig):
            raw_signals[sig].pop(0)
            pre_consumed.append(sig)
        else:  # (taken from the run with wfe.internal.take_signal: it holds it for us)
            unclaimed.append((str(r["name"]), sig))
    return pre_consumed, recorded, unclaimed


async def parked_events(store: BlobStore, keys: Sequence[str]) -> list[dict[str, Any]]:
    """The events kept under ``keys`` of ``outbox/<run>/``: a batch (a JSON list) per key, or
    one event per key (parked by a worker before batches)."""
    out: list[dict[str, Any]] = []
    for k in keys:
        kept = pydantic_core.from_json(await store.get(k))
        out.extend(kept if isinstance(kept, list) else [kept])
    return out


PARK_AFTER_S = 0.05
"""How long a stage runs before a sinkless worker parks the small batch of events its
activity carries (runs marked ``parking = "when-slow"``, see ``_outbox``): the events of a
slow stage reach the BlobStore while it runs, a fast stage writes no blob for them."""

HANDED_BACK: dict[str, Any] = {"ok": False, "handed_back": True}
"""A carried batch not delivered nor parked: the run keeps it (``_outbox``)."""


def in_order(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` in sequence order, each id once (a batch parked twice, by a stage activity
    that carried it and by a later ``wfe.publish``, overlaps another)."""
    unique = {e["id"]: e for e in reversed(events)}  # the first copy of each id wins
    return sorted(unique.values(), key=lambda e: e["seq"])


def _failed_attempt(
    stage_id: str, attempt: int, doc: dict[str, Any], meta: dict[str, Any]
) -> ApplicationError:
    """A failed stage attempt (its result document ``doc``) as Temporal shows a failed
    activity: the user's error type, message and traceback, with ``meta`` (the bookkeeping the
    run reads) in the details' metadata. It is non-retryable for Temporal: the workflow applies
    the stage's own retry policy (a new activity per attempt, each failure shown);
    ``retryable`` in the details says whether the stage's policy may retry it."""
    error = doc["error"]
    shown: dict[str, Any] = {"stage": stage_id, "attempt": attempt, "retryable": doc["retryable"]}
    if error.get("traceback"):
        shown["traceback"] = error["traceback"]
    return ApplicationError(
        error["message"],
        carry(shown, meta, activity.payload_converter()),
        type=error["type"],
        non_retryable=True,
    )


def _shaped(req: StageRequest, doc: dict[str, Any]) -> Any:
    """A try's result document as the activity of a run of this driver returns it (``_carry``):
    the output (a suspension: where it waits) with the rest in the payload's metadata; a
    failed attempt raises."""
    if doc["kind"] == "failed":
        raise _failed_attempt(req.stage_id, req.attempt, doc, doc)
    if doc["kind"] == "suspended":
        shown: Any = {"suspended": doc["waiting_for"], "until": doc["until"]}
    else:
        shown = doc.pop("output")
    return carry(shown, doc, activity.payload_converter())


def _report_run_time(value: Any, began: float, clock: Any) -> None:
    """Put how long the local activity has run since ``began`` (``time.monotonic``) and the
    run's clock its task gave (``clock``, if any) in the metadata of its result or failure
    detail ``value`` (a payload this driver shaped: ``_shaped``, ``_failed_attempt``)."""
    if not isinstance(value, RawValue):
        return
    meta = meta_of(value.payload)
    if meta is None:
        return
    meta["took_s"] = round(time.monotonic() - began, 6)
    if clock is not None:
        meta["clock"] = clock
    value.payload.metadata[META_KEY] = pydantic_core.to_json(meta)


def _unconsumed(queues: dict[str, list[Any]], consumed: Sequence[str]) -> dict[str, list[Any]]:
    """The signal ``queues`` an attempt was handed, less the oldest one of each name it
    ``consumed`` (once per consumption)."""
    left = {name: list(queue) for name, queue in queues.items()}
    for name in consumed:
        if left.get(name):
            left[name].pop(0)
    return {name: queue for name, queue in left.items() if queue}


def _case_safe(task: dict[str, Any]) -> bool:
    """Whether ``task``'s run makes blob keys unique whatever the case (its start document's
    ``blob_keys``, handed in the task as ``keys``; absent: a run started before)."""
    return task.get("keys") == BLOB_KEYS_CASE_SAFE


def _journal_of(task: dict[str, Any], compensation: bool) -> str:
    """The journal prefix of ``task``'s stage (or its compensation)."""
    what = "compensate" if compensation else "stage"
    return journal_prefix(
        task["run_id"], task["stage_id"], task["redrive"], what, case_safe=_case_safe(task)
    )


def _journal(store: BlobStore, task: dict[str, Any], compensation: bool) -> StepJournal:
    """The step journal of ``task``'s stage (or its compensation)."""
    return StepJournal(store, _journal_of(task, compensation), case_safe=_case_safe(task))


# what every stage of a run's local chain shares with the attempt that heads it
_RUN_KEYS = (
    "run_id",
    "workflow_id",
    "version",
    "redrive",
    "input",
    "trace_context",
    "reset",
    "keys",
)


class _Beat:
    """A stage activity's heartbeat. Liveness only: a worker that stops heartbeating is
    declared lost. The first beat comes after ``every`` seconds (a fraction of the heartbeat
    timeout, which Temporal counts from the activity's start): a short stage sends none (a beat
    at once cost every stage a heartbeat RPC, a write of the activity's state on the server).
    A timer on the loop rather than a task: a stage that ends before its first beat (most do)
    only sets and cancels it."""

    def __init__(self, every: float) -> None:
        self._every = every
        self._loop = asyncio.get_running_loop()
        # (the callback runs in a copy of this context: the activity's, which it beats for)
        self._timer = self._loop.call_later(every, self._beat)

    def _beat(self) -> None:
        activity.heartbeat()
        self._timer = self._loop.call_later(self._every, self._beat)

    def stop(self) -> None:
        self._timer.cancel()


class DriverActivities:
    """Activity implementations bound to one engine (registry, blob store, event sink)."""

    def __init__(
        self,
        registry: Registry,
        claim: ClaimCheck,
        runner: StageRunner,
        sink: EventSink | None,
        stats: EventStats,
        heartbeat_every: float,
        take_timeout: float = 10.0,
        take_tries: int = 3,
    ) -> None:
        self.registry = registry
        self.claim = claim
        self.runner = runner
        self.sink = sink
        self.stats = stats
        self.heartbeat_every = heartbeat_every
        self.take_timeout = take_timeout  # seconds a wait asks its run for a signal, per try
        self.take_tries = take_tries  # tries when the ask gets no answer (timeout, busy)
        self.kept = KeptLocks()
        # a dead_letter call is one run's batch: an outage of many runs shares the few
        # warnings of a minute, the rest log at DEBUG and are counted in one line
        self.dead_letter_log = DeadLetterLog(_log, window_seconds=60.0)

    def bookkeeping(self) -> list[Any]:
        """The small activities every worker that runs workflow tasks registers (they run as
        local activities of the workflow)."""
        return [self.publish, self.dead_letter, self.save_state, self.read_journal]

    # -- stage attempts and compensations -----------------------------------------------------
    @activity.defn(dynamic=True)
    async def stage(self, args: Sequence[RawValue]) -> Any:
        """A stage attempt or compensation (``_attempt``), or a local chain (``_chain``). Run
        as a local activity (a ``local=True`` stage), its result (or its failure's details)
        says how long it ran (``took_s``, seconds) and gives back the run's clock its task
        carried (``clock``): the run's clock reads them (``_clock``)."""
        if not activity.info().is_local:
            return await self._stage_activity(args)
        began = time.monotonic()
        clock = (meta_of(args[0].payload) or {}).get("clock") if args else None
        try:
            result = await self._stage_activity(args)
        except ApplicationError as exc:
            if exc.details:
                _report_run_time(exc.details[0], began, clock)
            raise
        _report_run_time(result, began, clock)
        return result

    async def _stage_activity(self, args: Sequence[RawValue]) -> Any:
        info = activity.info()
        conv = activity.payload_converter()
        meta = meta_of(args[0].payload)
        compensation = info.activity_type.endswith(COMPENSATE_SUFFIX)
        task: dict[str, Any]
        if meta is None:  # scheduled by a run of an older driver: one document, old result
            task = conv.from_payload(args[0].payload, dict)
            return await self._stage(info, task, compensation, carried=False)
        # the business values as arguments (see ``_workflow.GraphWorkflow._call``), the
        # engine's bookkeeping in the first one's metadata
        values = [conv.from_payload(a.payload) for a in args]
        if compensation:
            upstream = values[2] if len(values) > 2 else {}
            task = {**meta, "output": values[0], "input": values[1], "outputs": upstream}
        else:
            task = {**meta, "input": values[0], "outputs": values[1] if len(values) > 1 else {}}
        chain = task.pop("chain", None)
        if chain:
            return await self._chain(info, task, chain)
        return await self._stage(info, task, compensation, carried=True)

    async def _chain(
        self, info: activity.Info, task: dict[str, Any], chain: list[dict[str, Any]]
    ) -> Any:
        """A ``local=True`` stage attempt (``task``) and, each time the last one completed,
        the next stage of ``chain``: the fresh local stages after it, each alone in its group
        (``GraphWorkflow._chain``), each at attempt 1 with the signals the earlier ones left
        and the outputs they produced. The result is the first stage's, with the others'
        documents under ``chained``, in order, up to the first that did not complete; a
        chained stage that failed fails the local activity with its own error (shown red,
        the details naming the stage), carrying the same bookkeeping. A cancel while a chained
        stage runs ends it ``cancelled`` (the ones before it completed); a chained stage the
        engine's storage failed is left out, and the run runs it again itself (the steps it
        journaled replay)."""
        outcome, req, head = await self._attempt(info, task, False)
        head = await self._document(task, req, outcome, head, False, inline=True)
        if head["kind"] != "completed":
            return _shaped(req, head)
        outputs = {req.stage_id: head["output"]}
        queues = _unconsumed(task.get("signal_queues") or {}, head["consumed"])
        ran: list[dict[str, Any]] = []
        for link in chain:
            sid = link["stage_id"]
            sub = {k: task[k] for k in _RUN_KEYS if k in task}
            sub.update(
                stage_id=sid,
                attempt=1,
                steps=[],
                signal_queues=queues,
                output=None,
                outputs={**link["outputs"], **{a: outputs[a] for a in link["chained"]}},
            )
            if "try" in task:
                sub["try"] = 0  # (a fresh attempt's first try)
            try:
                outcome, sub_req, doc = await self._attempt(info, sub, False)
            except asyncio.CancelledError:
                ran.append({"stage_id": sid, "kind": "cancelled"})
                break
            except Exception:
                break
            doc = await self._document(sub, sub_req, outcome, doc, False, inline=True)
            ran.append({"stage_id": sid, **doc})
            if doc["kind"] != "completed":
                break
            outputs[sid] = doc["output"]
            queues = _unconsumed(queues, doc["consumed"])
        if ran and ran[-1]["kind"] == "failed":
            raise _failed_attempt(ran[-1]["stage_id"], 1, ran[-1], {**head, "chained": ran})
        output = head.pop("output")
        return carry(output, {**head, "chained": ran}, activity.payload_converter())

    async def _stage(
        self, info: activity.Info, task: dict[str, Any], compensation: bool, *, carried: bool
    ) -> Any:
        """One stage attempt or compensation; ``carried``: the result is the stage's output
        (its bookkeeping in the payload's metadata) and a failure raises (see ``_carry``)."""
        outcome, req, result = await self._attempt(info, task, compensation)
        doc = await self._document(task, req, outcome, result, compensation, inline=carried)
        return _shaped(req, doc) if carried else doc

    async def _attempt(
        self, info: activity.Info, task: dict[str, Any], compensation: bool
    ) -> tuple[Completed | Failed | Suspended | _Recorded, StageRequest, dict[str, Any]]:
        """Run the stage body (or its compensation) of ``task``: its outcome, its request and
        the bookkeeping of its result (steps journaled, signals consumed, events published);
        a local try that had ended already: its recorded result document."""
        req, missing = await self._request(task)
        if missing is not None:
            # a value the try needs is not in the blob store: it fails for good, its body
            # never runs (see StageRunner.values_missing)
            failed = self.runner.values_missing(req, missing, compensation=compensation)
            return failed, req, {"steps": [], "consumed": []}
        journal: dict[str, dict[str, Any]] = {}
        records = {r["name"]: r for r in task["steps"]}
        log = _journal(self.claim.store, task, compensation)
        # buffered payloads per signal name, oldest first (a task scheduled before signals
        # queued carries "signals": one payload per name)
        raw_signals: dict[str, list[Any]] = {
            name: list(queue) for name, queue in (task.get("signal_queues") or {}).items()
        }
        for name, payload in (task.get("signals") or {}).items():
            raw_signals.setdefault(name, [payload])
        given = {name: len(queue) for name, queue in raw_signals.items()}
        pre_consumed: list[str] = []
        unclaimed: list[tuple[str, str]] = []
        if info.attempt > 1 or info.is_local or task.get("reset"):
            # a previous try of this attempt died: steps it journaled replay, never run again
            # (a local activity re-run after a lost worker starts again at try 1: always
            # look; after an operator's reset the run's ledger forgot steps: look too)
            # (after a reset the operator asked for the stage again: its body runs)
            outcome_name = None if task.get("reset") else _outcome_name(info, task, compensation)
            pre_consumed, recorded, unclaimed = await _journaled_by_lost_try(
                log, records, journal, raw_signals, outcome_name
            )
            if recorded is not None:
                log.close()
                return _Recorded(recorded), req, {}
            if info.attempt > 1 or (journal and not task.get("reset")):
                # an earlier try of this very attempt ran (a lost worker; a storage fault):
                # it resumes (after an operator's reset the journal holds the run's old steps)
                req = dataclasses.replace(req, resumed=bool(records))
        loaded = {name: await self._load_record(r, req.run_id) for name, r in records.items()}
        signals = {
            k: [await self.claim.load(v, run_id=req.run_id) for v in queue]
            for k, queue in raw_signals.items()
            if queue
        }

        # the step values the stage's ledger carries inline (in this activity's result, the
        # inputs of its later attempts, a continue-as-new): past ``_STEPS_INLINE`` bytes, each
        # new one over ``_STEP_KEPT_INLINE`` goes to the BlobStore. An attempt that took 2,000
        # signals of 1 KB reported a 2.3 MB suspension, which Temporal refused: it never ended
        inline = [sum(len(pydantic_core.to_json(r.get("result"))) for r in task["steps"])]

        async def spill(rec: StepRecord) -> dict[str, Any]:
            data = record_to_json(rec)
            size = len(pydantic_core.to_json(rec.result))
            force = size > _STEP_KEPT_INLINE and inline[0] + size > _STEPS_INLINE
            if not force and size <= self.claim.threshold:
                inline[0] += size
            key = spill_key(
                req.run_id,
                "steps",
                req.stage_id,
                task["redrive"],
                rec.name,
                case_safe=_case_safe(task),
            )
            data["result"] = await self.claim.dump(rec.result, key, force=force)
            return data

        take: TakeSignal | None = None
        if not compensation and not info.is_local and task.get("token") is not None:
            # (a local activity runs inside the run's workflow task: the run cannot answer it)

            async def take(key: str, name: str) -> tuple[bool, Any]:
                return await self._take_signal(info, task, given.get(name, 0), key, name)

            if task.get("reset"):
                for key, name in unclaimed:
                    # the signal this journaled wait took before the operator's reset is
                    # queued in the run again (Temporal re-applies the signals that came
                    # after the reset point): take it for the wait's key, or a later wait
                    # would take it a second time
                    await take(key, name)

        ledger = _JournalLedger(loaded, signals, journal, spill, log, take)
        outcome, published = await self._run_body(info, task, req, ledger, log, compensation)
        if isinstance(outcome, Abandoned):
            # the engine's storage (the step journal, the blob store) failed: the activity's
            # own retry policy runs this try again, keeping the stage attempt; steps this try
            # journaled replay from the journal (DESIGN §5)
            raise ApplicationError(
                f"stage {req.stage_id!r} attempt {req.attempt}: {outcome.reason}",
                type="InfrastructureFault",
            )
        result: dict[str, Any] = {
            "steps": list(journal.values()),
            "consumed": pre_consumed + list(ledger.consumed),
        }
        if published is not None:
            result["published"] = published
        return outcome, req, result

    async def _request(
        self, task: dict[str, Any]
    ) -> tuple[StageRequest, SpilledPayloadUnavailableError | None]:
        """The StageRunner's request for ``task`` (its values loaded from the claim check),
        and the error of a value the blob store lacks (the request then holds none); an
        unknown workflow version fails the activity for good."""
        try:
            wf = self.registry.get(task["workflow_id"], task["version"])
        except EngineError as exc:
            raise ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True) from None
        req = StageRequest(
            run_id=task["run_id"],
            workflow=wf,
            stage_id=task["stage_id"],
            attempt=task["attempt"],
            input=None,
            # resumed: steps journaled by this attempt before (a suspension, a lost worker);
            # a new attempt (``new_attempt``, tasks since 2026-12-05) replays steps of earlier
            # attempts but starts; a task without the key: any steps meant resumed
            resumed=bool(task["steps"]) and not task.get("new_attempt", False),
            trace_context=task.get("trace_context"),
            version=task["version"],
        )
        try:
            loaded = dataclasses.replace(
                req,
                input=await self.claim.load(task["input"], run_id=task["run_id"]),
                outputs={
                    k: await self.claim.load(v, run_id=task["run_id"])
                    for k, v in task["outputs"].items()
                },
            )
        except SpilledPayloadUnavailableError as exc:
            return req, exc
        return loaded, None

    async def _run_body(
        self,
        info: activity.Info,
        task: dict[str, Any],
        req: StageRequest,
        ledger: _JournalLedger,
        log: StepJournal,
        compensation: bool,
    ) -> tuple[Outcome, dict[str, Any] | None]:
        """Run the stage body (or its compensation) while heartbeating and delivering the
        run's events this activity carries (``_outbox``): its outcome and what was
        published."""
        # local activities have no heartbeat: the workflow task's timeout notices a lost worker
        beat = None if info.is_local else _Beat(self.heartbeat_every)
        to_publish = task.get("publish")
        publishing: asyncio.Future[dict[str, Any]] | None = None
        later: asyncio.TimerHandle | None = None
        if isinstance(to_publish, dict):
            events = whole(to_publish.get("events") or [], task["run_id"], task["workflow_id"])
            carried: dict[str, Any] = {**to_publish, "events": events}
            if self.sink is None and carried.get("lazy"):
                # (a sinkless worker: a stage that ends before PARK_AFTER_S hands the batch
                # back to the run unparked; a slower one parks it then, as before)
                def park() -> None:
                    nonlocal publishing
                    publishing = asyncio.ensure_future(self._publish_carried(carried))

                later = asyncio.get_running_loop().call_later(PARK_AFTER_S, park)
            else:
                publishing = asyncio.ensure_future(self._publish_carried(carried))
        published: dict[str, Any] | None = None
        try:
            if compensation:
                try:
                    output = await self.claim.load(task["output"], run_id=req.run_id)
                except SpilledPayloadUnavailableError as exc:
                    outcome: Outcome = self.runner.values_missing(req, exc, compensation=True)
                else:
                    outcome = await self.runner.compensate(req, output, ledger)
            else:
                outcome = await self._unless_frozen(info, task, self.runner.run(req, ledger))
        finally:
            log.close()
            if beat is not None:
                beat.stop()
            if later is not None:
                later.cancel()
            if publishing is not None:
                published = await publishing
            elif later is not None:
                published = dict(HANDED_BACK)
        return outcome, published

    async def _document(
        self,
        task: dict[str, Any],
        req: StageRequest,
        outcome: Completed | Failed | Suspended | _Recorded,
        result: dict[str, Any],
        compensation: bool,
        *,
        inline: bool,
    ) -> dict[str, Any]:
        """``result`` completed with the outcome: ``kind`` and the output (stored: ``inline``
        up to the spill threshold, DESIGN §5, so the UI shows it; else always a reference, as
        older runs expect) and events, the error, or where the attempt waits. A local try's
        document is journaled (``_Recorded``) before the workflow task records it."""
        if isinstance(outcome, _Recorded):
            # (``again``: the run may then deliver a signal its wait resumes for at once,
            # which reached the run after the try's suspension: ``SignalHandlers._answer``)
            return {**outcome.doc, "again": True}
        await self._fill(task, req, outcome, result, compensation, inline=inline)
        name = _outcome_name(activity.info(), task, compensation)
        if name is not None:
            record = _journal(self.claim.store, task, compensation)
            try:
                await record.append({"name": name, "kind": "outcome", "doc": result})
            except Exception as exc:  # the store failed: a lost task then runs the try again
                activity.logger.warning("local try's result not journaled: %s", exc)
            finally:
                record.close()
        return result

    async def _fill(
        self,
        task: dict[str, Any],
        req: StageRequest,
        outcome: Completed | Failed | Suspended,
        result: dict[str, Any],
        compensation: bool,
        *,
        inline: bool,
    ) -> None:
        if isinstance(outcome, Completed):
            output = None
            if not compensation:
                key = spill_key(
                    req.run_id,
                    "outputs",
                    req.stage_id,
                    f"r{task['redrive']}-a{req.attempt}",
                    case_safe=_case_safe(task),
                )
                output = await self.claim.dump(outcome.output, key, force=not inline)
            events = [{"type": e.type, "data": e.data} for e in outcome.events]
            result.update(kind="completed", output=output, events=events)
        elif isinstance(outcome, Failed):
            result.update(
                kind="failed", error=outcome.error.model_dump(), retryable=outcome.retryable
            )
        else:
            result.update(
                kind="suspended",
                reason=outcome.reason,
                until=None if outcome.until is None else outcome.until.isoformat(),
                waiting_for=outcome.waiting_for,
                step=outcome.step,
            )

    async def _unless_frozen(
        self, info: activity.Info, task: dict[str, Any], body: Coroutine[Any, Any, T]
    ) -> T:
        """Run the stage body; a cancel sent by a migration freeze (which cannot know whether
        a worker picked the activity up) leaves it running: a running stage is waited for."""
        work = asyncio.ensure_future(body)
        frozen = False  # a freeze cancels once: any later cancel is a real one
        while True:
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                if frozen or work.done() or not await self._freeze_cancelled(info, task):
                    work.cancel()
                    return await work
                frozen = True

    async def _freeze_cancelled(self, info: activity.Info, task: dict[str, Any]) -> bool:
        details = activity.cancellation_details()
        if task.get("token") is None or info.workflow_id is None:
            return False
        if details is not None and not details.cancel_requested:
            return False  # a worker shutdown, a timeout: not the run's doing
        handle = activity.client().get_workflow_handle(
            info.workflow_id, run_id=info.workflow_run_id
        )
        try:
            answer = await handle.query(
                FREEZE_CANCELLED_QUERY, task["token"], rpc_timeout=timedelta(seconds=5)
            )
            return bool(answer)
        except Exception:  # the run cannot answer: treat it as a cancel (journaled steps stay)
            return False

    async def _take_signal(
        self, info: activity.Info, task: dict[str, Any], given: int, key: str, name: str
    ) -> tuple[bool, Any]:
        """Ask the run for the oldest free buffered signal ``name`` (this attempt took all the
        ``given`` ones of its task already). The run records the take with
        this attempt (``SignalHandlers.on_take_signal``): a retry of a lost try asking for the
        same step gets the same signal, and one whose wait never completed goes back to the
        queue when the attempt's result arrives. A rejection (nothing buffered, the run
        frozen) means: suspend. An ask that got no answer (timed out, the server busy) is
        repeated with the same update id, so a first ask the run did receive is answered
        once; only after ``take_tries`` such asks does the wait suspend (it then resumes the
        usual way). ``given`` only counts on a run started before shared takes, which left
        the signals it handed out in its queue."""
        assert info.workflow_id is not None
        handle = activity.client().get_workflow_handle(
            info.workflow_id, run_id=info.workflow_run_id
        )
        body = {
            "stage": task["stage_id"],
            "token": task["token"],
            "key": key,
            "name": name,
            "given": given,
        }
        update_id = f"wfe-take-{task['stage_id']}-{task['token']}-{key}"
        res: dict[str, Any] = {}
        for tried in range(1, self.take_tries + 1):
            try:
                res = await handle.execute_update(
                    TAKE_SIGNAL_UPDATE,
                    body,
                    id=update_id,
                    result_type=dict,
                    rpc_timeout=timedelta(seconds=self.take_timeout),
                )
                break
            except asyncio.CancelledError:
                raise
            except WorkflowUpdateFailedError:  # rejected: nothing to take, the wait suspends
                return False, None
            except (WorkflowUpdateRPCTimeoutOrCancelledError, RPCError) as exc:
                if isinstance(exc, RPCError) and exc.status not in _TRANSIENT:
                    return False, None
                if tried == self.take_tries:
                    return False, None
                await asyncio.sleep(0.2 * tried)
            except Exception:  # anything else: the wait suspends and resumes the usual way
                return False, None
        if not res.get("taken"):
            return False, None
        return True, await self.claim.load(res.get("payload"), run_id=info.workflow_id)

    async def _load_record(self, data: dict[str, Any], run_id: str) -> StepRecord:
        rec = record_from_json(data)
        if rec.completed:
            rec = rec.loaded(await self.claim.load(rec.result, run_id=run_id))
        return rec

    # -- events -------------------------------------------------------------------------------
    @activity.defn(name="wfe.publish")
    async def publish(self, events: list[dict[str, Any]], parked: bool = False) -> dict[str, Any]:
        """Deliver a batch of one run's events to the sink; a failure is reported, not raised
        (the workflow counts failures and dead-letters the batch).

        A worker with no sink keeps the batch in the shared BlobStore (``outbox/<run>/``) and
        reports ``parked``; the next worker with a sink that publishes for the run (told so by
        ``parked``) delivers the kept events first, in order, and ``flush_events()`` of an
        engine with a sink delivers what is left (at-least-once, like the native outbox)."""
        return await self.deliver(events, parked, count_failures=True)

    async def _publish_carried(self, carried: dict[str, Any]) -> dict[str, Any]:
        """Deliver the events a stage activity (or ``wfe.save_state``) carries for its run
        (see ``_outbox``) and say up to which sequence number (``upto``). A failure is not
        counted here: the events stay unconfirmed and ``wfe.publish`` delivers them with the
        outbox's retry rule, counting its failures."""
        events = list(carried.get("events") or [])
        parked = bool(carried.get("parked"))
        if not events:
            return {"ok": True, "parked": parked, "upto": 0}
        try:
            res = await self.deliver(events, parked, count_failures=False)
        except Exception as exc:  # the blob store of a sinkless worker: wfe.publish retries
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {**res, "upto": int(events[-1]["seq"])}

    async def deliver(
        self, events: list[dict[str, Any]], parked: bool, *, count_failures: bool
    ) -> dict[str, Any]:
        store = self.claim.store
        if self.sink is None:
            if events:
                # one blob per batch, not per event (a fan-out's wfe.publish of 50 events
                # wrote 50 files on its workflow task's critical path)
                key = outbox_batch_key(events[0]["run_id"], events[0]["seq"], events[-1]["seq"])
                await put_small(store, key, pydantic_core.to_json(events))
            return {"ok": True, "parked": parked or bool(events)}
        if not events:
            return {"ok": True, "parked": parked}
        if not parked:
            return await self.publish_batch(events, count_failures=count_failures)
        async with self.kept.holding(events[0]["run_id"]):
            keys = await store.list(outbox_prefix(events[0]["run_id"]))
            batch = in_order(await parked_events(store, keys) + list(events))
            return await self.publish_batch(batch, keys, count_failures=count_failures)

    async def publish_batch(
        self, batch: list[dict[str, Any]], keys: Sequence[str] = (), *, count_failures: bool = True
    ) -> dict[str, Any]:
        """Publish ``batch`` to the sink, then delete the kept ``keys`` it includes (hold the
        run's ``kept`` lock when there are any); ``{"ok": False, "error": ...}`` when the sink
        refused it (counted as failed events when ``count_failures``)."""
        assert self.sink is not None
        # (the user's sink: whatever it raises, or a call that hangs, is a refusal; it must
        # not hold the stage activity that carried the batch, nor an activity slot)
        error = await publish_to_sink(self.sink, [Event.model_validate(e) for e in batch])
        if error is not None:
            # (events, as on the native driver; an uncounted failure is retried and counted
            # by wfe.publish)
            self.stats.refused(error, len(batch) if count_failures else 0)
            return {"ok": False, "error": error}
        self.stats.delivered += len(batch)
        for k in keys:
            await self.claim.store.delete(k)
        return {"ok": True, "parked": False}

    async def deliver_parked(self) -> int:
        """Deliver every event a sinkless worker kept in the BlobStore, per run in order."""
        if self.sink is None:
            return 0
        store = self.claim.store
        by_run: dict[str, list[str]] = {}
        for k in await store.list("outbox/"):
            by_run.setdefault(k.split("/")[1], []).append(k)
        n = 0
        for run_id in by_run:
            async with self.kept.holding(run_id):
                # (listed again under the lock: a retry may have taken some meanwhile)
                keys = await store.list(outbox_prefix(run_id))
                try:
                    kept = in_order(await parked_events(store, keys))
                except Exception:  # (another process's worker delivered them meanwhile)
                    continue
                if kept and (await self.publish_batch(kept, keys))["ok"]:
                    n += len(kept)
        return n

    @activity.defn(name="wfe.dead_letter")
    async def dead_letter(self, events: list[dict[str, Any]]) -> None:
        """Keep undeliverable events in the shared BlobStore under ``dlq/`` (replay_dlq), and
        log them as the native outbox does (a few warnings, the rest at DEBUG: DeadLetterLog)."""
        for e in events:
            await self.claim.store.put(
                dlq_key(e["run_id"], e["seq"], e["id"]), pydantic_core.to_json(e)
            )
        self.stats.dead_lettered(len(events))
        error = self.stats.last_error
        self.dead_letter_log.log_batch(
            [DeadLetteredEvent(e["id"], e["run_id"], int(e["seq"]), None, error) for e in events],
            scope="publish batch",
        )

    @activity.defn(name=READ_JOURNAL_ACTIVITY)
    async def read_journal(
        self, run_id: str, stage_id: str, redrive: int, keys: str | None = None
    ) -> list[dict[str, Any]]:
        """The step records a stage's attempts journaled (see the module docstring); ``keys``:
        the run's ``blob_keys`` (absent: a run started before, or a workflow of its code)."""
        case_safe = keys == BLOB_KEYS_CASE_SAFE
        prefix = journal_prefix(run_id, stage_id, redrive, "stage", case_safe=case_safe)
        log = StepJournal(self.claim.store, prefix, case_safe=case_safe)
        try:
            # without the mark of a signal taken from the run (it only guides a retried try),
            # nor a local try's result document: not a step (a ledger holding one failed the
            # redrive of a terminated run whose local stage had not completed)
            return step_records(await log.read())
        finally:
            log.close()

    @activity.defn(name="wfe.save_state")
    async def save_state(
        self,
        run_id: str,
        state: dict[str, Any],
        events: list[dict[str, Any]] | None = None,
        parked: bool = False,
    ) -> dict[str, Any] | None:
        """Store a finished run's full state (ledgers, outputs, staged events) for redrive;
        then deliver the run's last ``events`` when it carries them (``_outbox``: the one
        local activity of the run's last workflow task) and say what was delivered."""
        await put_small(self.claim.store, state_key(run_id), pydantic_core.to_json(state))
        if events is None:
            return None  # a run of the older rule publishes them with wfe.publish
        return await self._publish_carried({"events": events, "parked": parked})
