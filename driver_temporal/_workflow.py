"""The dynamic workflow that interprets a workflow graph.

Workflow type = the workflow id; every stage attempt is an activity whose type is the stage id.
A ``local=True`` stage (``StageSpec.local``) runs its attempts and compensations as Temporal
*local* activities of the same dynamic activity: the worker that runs the workflow task runs the
stage in-process and records the result as a ``MarkerRecorded`` event (no
``ActivityTaskScheduled``, no server dispatch: ~15 ms instead of ~65 ms per no-op stage here).
Same task, same StageRunner path, same events, ledger and claim check; the same
start-to-close timeout (stage timeout + grace) and infrastructure retry policy, run by the
worker itself, and no heartbeat timeout (a lost worker is noticed through the workflow task's
timeout instead, after which another worker replays the history and runs the attempt again;
steps it journaled are read back from the BlobStore, see ``_activities``). Keep local stages
short: a workflow task stays open while one runs. Consecutive local stages run as one local
activity (``_chain``, runs started since 2026-12-03): an attempt of a local stage alone in its
group goes on with the next groups' stages while each is alone, local, not started yet and the
one before it completed; the run then records each as if it had scheduled it (same events,
ids and order), and a chained stage that fails shows as the chain's failed local activity
with its own error.
The workflow holds each stage's step ledger, applies the stage's retry policy itself (the
activity's own RetryPolicy only re-runs lost workers and timeouts, keeping the attempt number),
sleeps on durable timers, waits on Temporal signals (buffered when sent early), runs saga
compensations, and builds every lifecycle event with ``engine_port.Lifecycle``.

A stage attempt starts (``stage.started``) when the workflow schedules its activity, as on the
native driver, with no round trip on the way. Stage activities are scheduled with
``WAIT_CANCELLATION_COMPLETED``, which makes a cancel an atomic test of whether a worker picked
the activity up: the server drops a scheduled activity at once (the workflow sees it cancelled),
while a started one only hears of the cancel and the workflow waits for its outcome.

Migration (freeze, snapshot, export completion) lives in ``_freezing.MigrationHandlers``, a base
of ``GraphWorkflow``; the signal queue (handlers, idempotency keys, what each stage attempt took
or was lent) in ``_signals.SignalHandlers``, another base.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.worker import WorkflowRunner
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from engine_port import ErrorInfo, GraphModel, Lifecycle, StepRecord, run_output
    from engine_port.driver import SnapshotStage, current_wait
    from engine_port.errors import RunTimeoutError

    from ._activities import COMPENSATE_SUFFIX, READ_JOURNAL_ACTIVITY
    from ._budget import CarryBudget
    from ._carry import carried_failure, carry, carry_info, meta_of
    from ._clock import LocalMark
    from ._freezing import Migrated, MigrationHandlers
    from ._inspection import RunInspection
    from ._names import (
        ABORT_EXPORT_UPDATE,
        COMPLETE_EXPORT_UPDATE,
        FREEZE_CANCELLED_QUERY,
        FREEZE_UPDATE,
        INTERNAL,
        NAMES_MARK,
        OLD_NAMES,
        RUN_INFO_QUERY,
        SIGNAL_UPDATE,
        TAKE_SIGNAL_UPDATE,
    )
    from ._outbox import EventOutbox
    from ._repin import RepinHandlers
    from ._signals import SignalHandlers
    from ._start import StartDocument
    from ._state import StageState
    from ._waiters import AnswersAfterActivation
    from ._wire import parse_time, record_to_json

__all__ = [
    "RUN_INFO_QUERY",
    "SIGNAL_UPDATE",
    "START_MEMO",
    "GraphWorkflow",
    "workflow_runner",
]

# the memo key of a run's start document (graph, version, settings, ...): everything but the
# input, which is the workflow's input (see ``GraphWorkflow.run``)
START_MEMO = "wfe_start"
_GRACE = 10.0  # seconds beyond a stage timeout before Temporal declares the attempt lost
# Temporal's retries of a stage activity: only what is not the user's (the user's errors come
# back non-retryable, and the workflow applies the stage's retry policy itself): a storage
# fault (``InfrastructureFault``), a lost or hung worker (heartbeat, start-to-close). As on
# native, they are retried for as long as they last, the attempt kept (DESIGN §5); a cap of 20
# tries charged a storage outage of ~3 minutes to the stage as a failed attempt
_INFRA_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=0,  # unlimited
)
# a driver local activity whose failure would otherwise fail the run: a storage fault is
# retried until the store answers (DESIGN §5)
_STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5)
)
_LOCAL_PATCH = "wfe-local-stages"
# runs started with this marker take every signal through ``wfe.internal.take_signal`` (or a
# lent one), concurrently; a run started before keeps the single-taker rule (``SignalHandlers``)
_SHARED_TAKES_PATCH = "wfe-shared-signal-takes"
# the deliveries (what became of a signal, by delivery id) a continued execution carries
_DELIVERIES_KEPT = 500
# Temporal's ContinueAsNewMinInterval (its default): the first task of an execution that
# continued from one younger than this runs only about this long after the continue
_CONTINUE_MIN_INTERVAL = timedelta(seconds=1)
# a Temporal timer shorter than about a second fires about a second after it started (seen
# on the dev server: timers of 0.02 s and 0.6 s fired after ~1 s; longer ones on time), so a
# wait the run continues in must have at least that long left in the new execution, after the
# continue itself (the new execution's first task, a round trip or two: ``_CONTINUE_SLACK``)
_TIMER_PRECISION = timedelta(seconds=1)
_CONTINUE_SLACK = timedelta(seconds=0.5)
# how far past its threshold a run may hold its continue for a timer (``_due_before_next``):
# a run whose waits all hold it (a poll every 1.2 s) still continues, a timer late then
_HOLD_EVENTS = 500


def workflow_runner() -> WorkflowRunner:
    """How workers run ``GraphWorkflow``: outside temporalio's sandbox. The sandbox guards
    user-written workflow code against non-determinism; here no user code runs in the workflow
    (stage bodies run in activities) and this interpreter only uses ``workflow.*`` for time,
    timers and randomness. Without the sandbox a workflow task costs about half as much (it
    re-imports modules per run and enters the sandbox for every payload it converts). What
    became of a signal reaches the engine once the activation that decided it ended
    (``_waiters.AnswersAfterActivation``)."""
    return AnswersAfterActivation()


class _StageFailed(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.error = error
        self.seq = 0  # the order in which stages of the run failed for good


class _Stopped(Exception):
    """A stage attempt ended because the run stops: a sibling failed for good, or the run
    was cancelled or timed out (the stage ends ``cancelled``)."""


def _outcome(task: asyncio.Task[BaseException | None]) -> BaseException | None:
    """What a finished stage task of ``_run_group`` reported (None while it runs)."""
    if not task.done():
        return None
    if task.cancelled():
        return _Stopped()  # stopped before its first step
    return task.result()


async def _to_the_end(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end. A cancel that arrives once the run compensates or finishes
    changes nothing (the run already stops; on native such a cancel is a no-op too), so it
    must not cut the compensation short or skip recording the run's end."""
    task = asyncio.ensure_future(work)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
    task.result()


def _failed_try(sid: str, exc: ActivityError | ApplicationError, cause: Any) -> dict[str, Any]:
    """The result of a stage activity that failed: a failed attempt with its bookkeeping
    carried, or one the workflow describes from the failure (a timeout, a lost worker's last
    error)."""
    carried = carried_failure(cause) if isinstance(cause, ApplicationError) else None
    if carried is not None:
        return carried
    if isinstance(cause, ApplicationError):
        etype, retryable = cause.type or "ApplicationError", not cause.non_retryable
    elif isinstance(cause, ActivityTimeoutError):
        etype, retryable = "StageTimeoutError", True
    else:
        etype, retryable = type(cause).__name__, True
    message = str(getattr(cause, "message", None) or exc.message)
    return {
        "kind": "failed",
        "error": {"type": etype, "message": message, "stage": sid},
        "retryable": retryable,
    }


def _reported(exc: ActivityError | ApplicationError, timeout: timedelta) -> dict[str, Any] | None:
    """What a local stage activity that failed reported for the run's clock (``_clock``): its
    failure's ``took_s`` and ``clock``; a timeout ran its timeout; nothing for a cancel (the
    run's time stays the activation's)."""
    cause = exc.cause if isinstance(exc, ActivityError) else exc
    if isinstance(cause, CancelledError):
        return None
    if isinstance(cause, ActivityTimeoutError):
        return {"took_s": timeout.total_seconds()}
    carried = carried_failure(cause) if isinstance(cause, ApplicationError) else None
    return carried or {}


def _iso(value: Any) -> str:
    return str(value.isoformat())


# how temporalio reads a declared signal's handler: one RawValue (the payload, metadata kept)
_ONE_PAYLOAD = inspect.Signature(
    [inspect.Parameter("payload", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RawValue)]
)


def _named_signal(
    on_signal: Callable[[str, Sequence[RawValue]], None],
    reject: Callable[[str, str], None],
    name: str,
) -> Callable[..., None]:
    """The handler of the declared signal ``name``. temporalio converts a handler's arguments
    by its signature: this one declares one ``RawValue`` (so the payload arrives with its
    metadata, as the dynamic handler gets it) yet takes any number, so a signal sent with no
    input or with several is queued or rejected and recorded, never failing the task."""

    def handler(*payloads: Any) -> None:
        if len(payloads) <= 1 and all(isinstance(p, RawValue) for p in payloads):
            on_signal(name, list(payloads))
        else:
            reject(name, f"a signal carries one input; this one carried {len(payloads)}")

    handler.__signature__ = _ONE_PAYLOAD  # type: ignore[attr-defined]
    handler.__annotations__ = {"payload": RawValue, "return": None}
    return handler


@workflow.defn(dynamic=True)
class GraphWorkflow(
    RunInspection, MigrationHandlers, RepinHandlers, SignalHandlers, EventOutbox, CarryBudget
):
    """Interprets a GraphModel passed in the start input (see ``_engine.TemporalEngine``)."""

    def __init__(self) -> None:
        # buffered signals in arrival order, each {name, payload, idempotency_key}: a wait for
        # a name takes the oldest of that name; every idempotency key the run has seen
        self._signals: list[dict[str, Any]] = []
        self._signal_keys: set[str] = set()
        self._deliveries: dict[str, dict[str, Any]] = {}
        self._held: dict[str, dict[str, dict[str, Any]]] = {}
        self._lent: dict[str, list[dict[str, Any]]] = {}
        self._reserved: dict[str, list[dict[str, Any]]] = {}
        self._holder_rule = False
        self._outbox: list[dict[str, Any]] = []  # events not yet delivered (``_outbox``)
        self._init_outbox()
        self._init_budget()
        self._closing = False
        self._final = False
        self._info: dict[str, Any] = {}
        self._sa: tuple[str, str] | None = None
        self._memo_at: tuple[Any, ...] | None = None  # (``_inspection``: the last memo written)
        self._ready = False
        self._frozen = False
        self._migrated_to: str | None = None
        self._inflight = 0  # stage attempts in flight (scheduled or running)
        self._slots: asyncio.Semaphore | None = None  # (``_slot``)
        # the documents of stages a local chain ran (``_chain``) the run has not recorded yet
        self._ahead: dict[str, dict[str, Any]] = {}
        self._locals = 0  # local stage activities in flight (attempts and compensations)
        # the history length of the workflow task in which a local activity last ended
        self._local_ended = -1
        # the stage activity in flight per stage: its token, handle and whether a freeze
        # cancelled it; the tokens a freeze cancelled (``wfe.internal.freeze_cancelled`` asks)
        self._calls: dict[str, dict[str, Any]] = {}
        self._tokens = 0
        self._freeze_cancels: set[int] = set()
        self._parked = False  # events kept in the BlobStore by a worker that had no sink
        self._dirty = False  # the memo and search attributes need writing (``_syncer``)
        self._status = "pending"
        self._run_id: str = ""
        # stopping the run's stages (see ``_run_group``): why ("failed" | "cancelled"), the
        # activity of each stage attempt in flight, how many stages failed for good so far
        self._stop_reason: str | None = None
        self._attempts: dict[str, Any] = {}
        self._failures = 0
        self._carried = False  # started by this driver: business values in the payloads
        self._marked = False  # started with the driver's marks (``run``)
        self._rejected: list[dict[str, Any]] = []  # signals not queued (``SignalHandlers``)
        self._early: list[tuple[str, Any, Any, Any, bool]] | None = []  # (``SignalHandlers``)
        # continue-as-new (``_continue``): the stage tasks of the group that runs, the stages
        # whose suspended attempt waits (``_wait``), whether a cancel of the run arrived
        self._group_tasks: dict[str, asyncio.Task[BaseException | None]] = {}
        self._waits: set[str] = set()
        # the length of the timer each of those waits set in this execution, and of the run
        # deadline's (``_due_before_next``: only a timer of a second or more fires on time)
        self._timer_s: dict[str, float] = {}
        self._deadline_s = 0.0
        # the wait of each attempt's last stage.suspended (a snapshot's ``suspended_in``): kept
        # in memory only, no command reads it (``_suspension_noted``)
        self._suspended_in: dict[str, dict[str, Any]] = {}
        # (and a cancel that reached the run frozen for a move, deferred: ``_watched``)
        self._cancel_seen = self._cancel_deferred = False
        self._continue_after: int | None = None
        # waits that ended in this execution: one that continued from another continues
        # again only after one did (else, at a threshold its fresh history already holds,
        # it would go on in a new execution at every first safe point, once a second)
        self._waits_ended = 0
        self._read_marks(workflow.memo_value(START_MEMO, None))

    def _read_marks(self, meta: Any) -> None:
        """(``__init__``) What the run's start memo says of the handlers it serves and of its
        signal rule, before any signal or update of its first task is handled."""
        if not (isinstance(meta, dict) and meta.get("names") == NAMES_MARK):
            self._serve_old_names()  # a run started before the wfe.internal.* names
        self._read_signal_rule(meta)
        self._init_repin(meta)  # (``_repin``)
        if isinstance(meta, dict) and meta.get("continued") and not meta.get("due_at_once"):
            # an execution continued by a driver before ``_early`` (it never set
            # ``due_at_once``): its first task queued each signal as it came, before the
            # carried state (a second arrival of a send the run had queued before the continue
            # was queued again, and a stage could take it), and replays so
            self._early = None

    # -- handlers ---------------------------------------------------------------------------
    @workflow.query(name=RUN_INFO_QUERY, description=INTERNAL)
    def run_info(self) -> dict[str, Any]:
        return self._info

    def _serve_old_names(self) -> None:
        """A run started before the ``wfe.internal.*`` names (``_names``) also answers to the
        older ones, so the updates its history holds replay and older engines reach it.
        Registered in ``__init__``: before any update of the run's first task is handled."""
        old = OLD_NAMES
        workflow.set_query_handler(old[RUN_INFO_QUERY], self.run_info)
        workflow.set_query_handler(old[FREEZE_CANCELLED_QUERY], self.freeze_cancelled)
        workflow.set_update_handler(
            old[FREEZE_UPDATE], self.on_freeze, validator=self._validate_freeze
        )
        workflow.set_update_handler(old[COMPLETE_EXPORT_UPDATE], self.on_complete_export)
        workflow.set_update_handler(old[ABORT_EXPORT_UPDATE], self.on_abort_export)
        workflow.set_update_handler(
            old[TAKE_SIGNAL_UPDATE], self.on_take_signal, validator=self._validate_take
        )
        workflow.set_update_handler(
            SIGNAL_UPDATE, self.on_signal_update, validator=self._validate_signal
        )

    def _patched(self, patch: str) -> bool:
        """``workflow.patched``, except on a run started with the driver's marks, which
        takes every patch without recording a marker."""
        return self._marked or workflow.patched(patch)

    def _declare_signals(self) -> None:
        """Register a handler per signal name the graph's stages declare, so the Web UI's
        "Send a Signal" (the ``__temporal_workflow_metadata`` query) lists them; each does
        what the dynamic handler does for any other name (``SignalHandlers.on_signal``)."""
        names = sorted({n for stage in self._graph.stages for n in stage.signals})
        for name in names:
            workflow.set_signal_handler(name, _named_signal(self.on_signal, self._reject, name))

    # -- main -------------------------------------------------------------------------------
    @workflow.run
    async def run(self, args: Sequence[RawValue]) -> Any:
        start = self._read_start(args)
        # a run started with the driver's marks (``StartDocument.marked``) was started on code
        # that has every patch below: it asks none (each would add a marker and a search
        # attribute upsert to its history)
        self._marked = start.marked
        # asked once, first thing: a run whose history lacks the marker replays the old rule
        self._holder_rule = not self._patched(_SHARED_TAKES_PATCH)
        self._setup(start)
        if self._marked:  # (runs started before took every signal through on_signal)
            self._declare_signals()
        publisher = asyncio.create_task(self._publisher())
        syncer = asyncio.create_task(self._syncer())
        if start.imported or start.continued:
            # moved here from another engine, which emitted its earlier events; or continued
            # from the run's previous execution (``_continue``), which did
            pass
        elif self._redrive == 0:
            self._emit(self._lc.run_created(self._version))
        else:
            self._emit(self._lc.run_redriven(start.redrive_from or "start", self._version))
        self._ready = True
        self._sync()
        outcome, error = await (self._watched() if self._hands_events else self._main())
        await _to_the_end(self._wind_up(outcome, error, publisher, syncer))
        return self._result(outcome, error)

    def _read_start(self, args: Sequence[RawValue]) -> StartDocument:
        """The run's start document. A run started by this driver: input = the run's input as
        the user gave it (stored form), the engine's start document in the memo and (since
        2026-12-03) the graph and stages in the input's metadata (``_start.CARRIED``); result =
        the run's output. A run started by an older driver has the whole document as input and
        the RunInfo as result."""
        conv = workflow.payload_converter()
        meta = workflow.memo_value(START_MEMO, None)
        self._carried = isinstance(meta, dict)
        raw: dict[str, Any]
        if isinstance(meta, dict):
            value = conv.from_payload(args[0].payload) if args else None
            carried = (meta_of(args[0].payload) if args else None) or {}
            raw = {**meta, **carried, "input": value}
        else:
            raw = conv.from_payload(args[0].payload, dict)
        return StartDocument.model_validate(raw)

    async def _watched(self) -> tuple[str, dict[str, Any] | None]:
        """``_main`` for runs whose events no activity carries are handed to the worker
        (``_outbox._hand_over``, in the publisher's task): a hand-over that failed (the
        worker's BlobStore, a worker not this driver's) is raised here, from the workflow's
        top-level coroutine, where an error fails the workflow task (an error in another task
        of the workflow fails nothing): Temporal runs the task again, and the events with it.
        A cancel of the run reaches ``_main`` as before, except (runs with
        ``defers_frozen_cancel``) one that arrives while the run is frozen for a move or moved:
        cancelling it then ended it cancelled here while the move went on (live and
        uncancelled on the target, ``complete_export`` refused, the cancel lost). The run
        goes on frozen, its move with it; the cancel is deferred (``_cancel_deferred``) and
        reaches ``_main`` only if the move is aborted (the run stays here). A completed move
        drops it: the run lives on its target, which the cancel never reached
        (``TemporalEngine.cancel`` tells its caller so: retry there)."""
        main = asyncio.ensure_future(self._main())
        while True:
            try:
                await workflow.wait_condition(
                    lambda: (
                        main.done()
                        or self._broken is not None
                        or self._may_continue()
                        or self._deferred_cancel_due()
                    )
                )
            except asyncio.CancelledError:
                if self._start.defers_frozen_cancel and (
                    self._frozen or self._migrated_to is not None
                ):
                    self._cancel_deferred = True
                    if self._migrated_to is not None:
                        workflow.logger.warning(
                            "run %s moved to %s: a cancel of it is dropped here; cancel it on "
                            "%s (through that driver's engine, or a routing engine over both)",
                            self._run_id,
                            self._migrated_to,
                            self._migrated_to,
                        )
                    else:
                        workflow.logger.warning(
                            "run %s is frozen for a move: a cancel of it is deferred (applied "
                            "if the move is aborted; a completed move drops it: cancel the run "
                            "on its target then)",
                            self._run_id,
                        )
                    continue
                if self._start.end_beats_cancel and self._end_decided():
                    workflow.logger.info(
                        "run %s: a cancel arrived after its end was decided: it ends as decided",
                        self._run_id,
                    )
                    continue
                self._cancel_seen = True
                main.cancel()
                continue
            if self._deferred_cancel_due():  # the move was aborted: the run is cancelled here
                self._cancel_deferred = False
                self._cancel_seen = True
                main.cancel()
                continue
            break
        if self._broken is not None:
            raise self._broken
        if not main.done():
            self._continue()
        return main.result()

    def _end_decided(self) -> bool:
        """Whether the run's end is decided by what it heard before a cancel that reaches it
        now (runs with ``StartDocument.end_beats_cancel``): every stage completed (or its
        attempt came back completed, not recorded yet), or a stage failed for good and no
        stage of its group is in flight. Such a cancel came after the outcome that ends the
        run (Temporal's history holds them in that order), as a cancel committed after the
        last outcome on the native driver finds the run ended; and the task that ends the run
        hands its last events over while it runs, so that a refused completion (the cancel
        reached the run meanwhile) runs again with the cancel and must end the same way."""
        ends = {sid: self._stage_end(sid) for sid in self._stages}
        if all(end == "completed" for end in ends.values()):
            return True
        return "failed" in ends.values() and all(
            task.done() or ends[sid] is not None for sid, task in self._group_tasks.items()
        )

    def _stage_end(self, sid: str) -> str | None:
        """How a stage ended for good, "completed" or "failed", recorded or not yet (its
        attempt's handle holds the try that ends it: the task that records it may run after
        a cancel delivered in the same activation); None while it has not."""
        st = self._stages[sid]
        if st.status in ("completed", "failed"):
            return st.status
        handle = self._attempts.get(sid)
        if handle is None or not handle.done() or handle.cancelled():
            return None
        exc = handle.exception()
        if exc is None:
            res = self._activity_result(handle.result())
        elif isinstance(exc, (ActivityError, ApplicationError)):
            cause = exc.cause if isinstance(exc, ActivityError) else exc
            if isinstance(cause, CancelledError):
                return None
            res = _failed_try(sid, exc, cause)
        else:
            return None
        if res.get("kind") == "completed":
            return "completed"
        final = not res.get("retryable") or st.attempt >= self._graph.stage(sid).retry.max_attempts
        return "failed" if res.get("kind") == "failed" and final else None

    def _deferred_cancel_due(self) -> bool:
        """A cancel deferred while the run was frozen (``_watched``), and the run stays here:
        its move was aborted, and it has not ended."""
        return (
            self._cancel_deferred
            and not self._frozen
            and self._migrated_to is None
            and not self._final
        )

    # -- continue-as-new ----------------------------------------------------------------------
    def _may_continue(self, *, unwritten: bool = False) -> bool:
        """Whether the run goes on in a new execution now (runs started with
        ``StartDocument.continue_after``): its history holds that many events, or Temporal
        suggests continuing, and it is at a safe point (``_at_safe_point``); an execution that
        continued from another only once one of its waits ended."""
        limit = self._continue_after
        if limit is None or not self._ready:
            return False
        if self._start.continued and not self._waits_ended:
            return False  # (no progress since the last continue: see ``_waits_ended``)
        info = workflow.info()
        if (
            info.get_current_history_length() < limit
            and not info.is_continue_as_new_suggested()
            and not self._takes_held()
        ):
            return False
        return self._at_safe_point(unwritten=unwritten) and not self._due_before_next()

    def _continuing(self) -> bool:
        """(Runs with ``StartDocument.continue_carries_events``.) Whether the run continues as
        new in this activation (``_may_continue``): its events are not handed over here but
        ride to the new execution, so that none reaches the sink from a task whose completion
        Temporal may refuse (a signal, update or cancel that reached the run while it ran:
        the task runs again with it, maybe on another path, numbering other events)."""
        # (a memo write pending is done in this activation, before the continue: ``_syncer``)
        return self._start.continue_carries_events and self._may_continue(unwritten=True)

    def _due_before_next(self) -> bool:
        """Whether a timer of the run (its deadline, the wake time of a wait) is due before a
        new execution could set it again and have it fire on time: Temporal runs the first
        task of one continued from an execution younger than ``_CONTINUE_MIN_INTERVAL``
        about that long after the continue, and a timer it then sets with less than about a
        second left fires about a second late (``_TIMER_PRECISION``): a wait ended up to
        ~1.2 s after it does in the run that never continued (a stage timeout, a retry
        backoff that followed it, all as late). The run continues once it fired, if it may
        then; when Temporal suggests continuing, it continues anyway (a late timer rather
        than a history that grows past Temporal's limit), and so it does once its history
        holds ``_HOLD_EVENTS`` more events than its threshold."""
        now = self._now()
        info = workflow.info()
        young = now < info.start_time + _CONTINUE_MIN_INTERVAL
        if not self._start.holds_for_timers:
            # (a run started before the rule: only a young execution's timers due within
            # that second held it, whatever their length; its history continued so)
            return young and self._due_by(now + _CONTINUE_MIN_INTERVAL)
        if young and self._timer_due(now + _CONTINUE_MIN_INTERVAL, 0.0):
            return True
        limit = (self._continue_after or 0) + _HOLD_EVENTS
        if info.is_continue_as_new_suggested() or info.get_current_history_length() >= limit:
            return False
        ready = now + _TIMER_PRECISION + _CONTINUE_SLACK
        if young:
            ready += _CONTINUE_MIN_INTERVAL
        # (a timer shorter than _TIMER_PRECISION is as late here as in a new execution)
        return self._timer_due(ready, _TIMER_PRECISION.total_seconds())

    def _due_by(self, ready: Any) -> bool:
        """Whether the run's deadline or the wake time of a wait is before ``ready`` (the
        rule of runs started before ``StartDocument.continue_hold``)."""
        due = [self._stages[sid].wake_at for sid in self._waits]
        if self._graph.timeout_s:
            due.append(self._deadline)
        times = [parse_time(at) for at in due]
        return any(at is not None and at < ready for at in times)

    def _timer_due(self, ready: Any, precise_s: float) -> bool:
        """Whether the run's deadline or the wake time of a wait is before ``ready``, of
        those whose timer in this execution was set for ``precise_s`` or more."""
        due = [(self._stages[sid].wake_at, self._timer_s.get(sid, 0.0)) for sid in self._waits]
        if self._graph.timeout_s:
            due.append((self._deadline, self._deadline_s))
        times = [(parse_time(at), length) for at, length in due]
        return any(at is not None and at < ready and length >= precise_s for at, length in times)

    def _at_safe_point(self, *, unwritten: bool = False) -> bool:
        """Nothing of the run is in flight but waits: no stage activity (attempt,
        compensation, local chain), no handler mid-way, no memo write pending (``unwritten``:
        but one, which ``_syncer`` does in this activation), no event pending (on runs
        started before ``StartDocument.continue_carries_events``: the events of a run that
        has it ride to the new execution), no signal lent or held, no stop, freeze or move;
        every unfinished stage of the group that runs is suspended in ``_wait`` on a timer, a
        signal or a poll, and none of them is about to resume for a signal that is free."""
        if (
            self._cancel_seen
            or self._final
            or self._closing
            or self._frozen
            or self._migrated_to is not None
            or self._stop_reason is not None
            or self._failures
            or self._status != "pending"
            or self._broken is not None
            or self._repin_to is not None
        ):
            return False
        if self._inflight or self._locals or self._ahead or self._calls or self._attempts:
            return False
        if (self._dirty and not unwritten) or self._carriers or self._finishing:
            return False
        if self._outbox and not self._start.continue_carries_events:
            return False  # (a run started before: its events are handed over first)
        if any(self._lent.values()) or any(self._held.values()) or self._signal_holder:
            return False
        if not workflow.all_handlers_finished():
            return False
        tasks = self._group_tasks
        waiting = [sid for sid, task in tasks.items() if not task.done()]
        if not waiting:
            return False
        if any(_outcome(task) is not None for task in tasks.values() if task.done()):
            return False
        for sid in waiting:
            st = self._stages[sid]
            if sid not in self._waits or st.status != "suspended" or not st.waiting_for:
                return False
            reason, _, name = st.waiting_for.partition(":")
            if reason == "signal" and self._signal_ready(name):
                return False
        return True

    def _continue(self) -> NoReturn:
        """Go on in a new execution of the run's workflow id (Temporal's continue-as-new),
        from a safe point (``_at_safe_point``), invisibly to the run's user: the new
        execution's start document carries the run's state as an import does (stages with
        their ledgers, suspended waits with their absolute deadlines, the signal queue and
        idempotency keys, the run's deadline) with ``continued`` set, so it emits no
        run.created and its event numbers go on from this one's; its memo and search
        attributes are this one's (the ``wfe_run`` memo current), and Temporal starts it
        on the same PINNED Worker Deployment version (a pinned override is inherited)."""
        recent = list(self._deliveries.items())[-_DELIVERIES_KEPT:]
        stages = {sid: StageState.fresh(sid, st) for sid, st in self._stages.items()}
        signals = [dict(sig) for sig in self._signals]
        # (runs with ``carry_budget``) the queued signals and stage outputs past it go to the
        # BlobStore: the input payload stays under Temporal's 2 MiB (``_budget``)
        self._carried_within_budget(signals, stages, self._start.carry_budget)
        doc = self._start.model_copy(
            update={
                "event_seq": self._seq,
                "stages": stages,
                "signals": signals,
                "signal_keys": sorted(self._signal_keys),
                "redrive_history": list(self._redrive_history),
                "run_started": self._run_started,
                "deadline": self._deadline,
                "continued": True,
                "parked": self._parked,
                # (``continue_carries_events``: this task's events, not handed over)
                "outbox": list(self._outbox),
                "deliveries": dict(recent),
                "due_at_once": True,
                "bounds_early": True,
                "frees_taken": True,
            }
        )
        conv = workflow.payload_converter()
        info = workflow.info()
        memo: dict[str, Any] = {k: RawValue(p) for k, p in info.raw_memo.items()}
        memo[START_MEMO] = doc.memo()
        if self._info:
            memo["wfe_run"] = self._info
        workflow.logger.info(
            "run %s continues as new after %d history events",
            self._run_id,
            info.get_current_history_length(),
        )
        workflow.continue_as_new(
            carry(doc.input, doc.carried(), conv),
            memo=memo,
            search_attributes=info.typed_search_attributes,
        )

    async def _main(self) -> tuple[str, dict[str, Any] | None]:
        """Run the stages (within the run's timeout, if any): how the run ends (``completed``,
        ``failed`` with its error, ``cancelled``, ``migrated``)."""
        try:
            # let update handlers delivered with the first task (a freeze for migration) act
            # before any stage starts: they wait on this same condition pass, registered
            # earlier; a cancel that arrived with the first task lands here (inside the try,
            # so the run still ends through _finish and saves its state)
            await workflow.wait_condition(lambda: True)
            if self._graph.timeout_s:
                deadline = parse_time(self._deadline)
                assert deadline is not None
                remaining = max(0.001, (deadline - self._now()).total_seconds())
                self._deadline_s = remaining
                await asyncio.wait_for(self._execute(), remaining)
            else:
                await self._execute()
        except Migrated:
            return "migrated", None
        except _StageFailed as failed:
            return "failed", failed.error
        except TimeoutError:
            self._cancel_active()
            timeout = RunTimeoutError(self._run_id, self._graph.timeout_s or 0.0)
            return "failed", {"type": "RunTimeoutError", "message": str(timeout), "stage": None}
        except asyncio.CancelledError:
            self._cancel_active()
            return "cancelled", None
        return "completed", None

    def _result(self, outcome: str, error: dict[str, Any] | None) -> Any:
        """The workflow's result once the run wound up: its output, or the failure or cancel
        it raises (which the Web UI shows)."""
        if outcome == "failed" and error is not None:
            # the details carry the stage and the user's traceback to the Web UI's failure
            details = {k: error[k] for k in ("stage", "traceback") if error.get(k)}
            raise ApplicationError(
                error["message"],
                *([details] if details else []),
                type=error["type"],
                non_retryable=True,
            )
        if outcome == "cancelled":
            raise asyncio.CancelledError()
        if not self._carried:
            return self._info
        if outcome != "completed":
            return None  # migrated: the run goes on (and ends) on its target
        outputs = {s.id: s.output for s in self._stages.values()}
        output = run_output(self._graph.sinks(), outputs)
        if self._start.result_run_info:
            # the final RunInfo memo (just written) rides out of sight in the result's
            # metadata: ``wait()`` reads it from the close event, with no describe after it
            # (a RunInfo too large to repeat there is left to the describe)
            carried = carry_info(output, self._info, workflow.payload_converter())
            if carried is not None:
                return carried
        return output

    async def _wind_up(
        self,
        outcome: str,
        error: dict[str, Any] | None,
        publisher: asyncio.Task[None],
        syncer: asyncio.Task[None],
    ) -> None:
        """Compensate if the run failed or was cancelled, record its end, deliver its last
        events."""
        if outcome in ("failed", "cancelled"):
            if error is not None:
                # the run's error is known from the moment it fails: ``get_run`` while it
                # compensates says why (as on the native driver)
                self._error = error
            await self._compensate()
        await self._finish(outcome, error)
        self._closing = True
        await publisher
        await syncer

    def _setup(self, start: StartDocument) -> None:
        self._start = start
        self._run_id = start.run_id
        self._wf_id: str = start.workflow_id
        self._version: str = start.version
        self._graph = GraphModel.model_validate(start.graph)
        self._redrive: int = start.redrive
        # the redrive this execution's step journals are kept under: its start document's (a
        # re-pin in place counts a redrive, ``_repin``, and keeps the journals where they are)
        self._journal: int = start.redrive
        # attempts superseded by redrives (here or on the engine a run moved from), kept for
        # the snapshot: {"redrive": n, "stage": id, "record": the stage record it replaced}
        self._redrive_history: list[dict[str, Any]] = list(start.redrive_history)
        self._lc = Lifecycle(self._run_id, self._redrive)
        bound = start.stage_activities
        self._slots = None if bound is None else asyncio.Semaphore(bound)
        self._seq: int = start.event_seq
        self._hb = timedelta(seconds=start.heartbeat_timeout_s)
        self._dead_after: int = start.dead_letter_after
        self._dead_min_s: float = start.dead_letter_min_seconds
        self._retry_initial_s: float = start.outbox_retry_initial_seconds
        self._retry_max_s: float = start.outbox_retry_max_seconds
        self._via_activities = start.events_via_activities
        self._one_carrier = start.one_carrier
        self._park_when_slow = start.parks_when_slow
        self._ends_on_worker = start.ends_on_worker
        self._hands_events = start.publishes_on_worker
        self._chains = start.chains_locals
        self._clock_from_locals = start.clock_from_locals
        self._group_of: dict[str, int] | None = None  # (``_chain``: built on first use)
        self._status = "pending"
        self._deadline: str | None = start.deadline
        if self._graph.timeout_s and self._deadline is None:
            self._deadline = _iso(self._now() + timedelta(seconds=self._graph.timeout_s))
        self._error: dict[str, Any] | None = None
        self._comp_errors: list[dict[str, Any]] = []
        self._finished_at: str | None = None
        self._run_started = start.run_started
        self._stages: dict[str, StageState] = {
            sid: StageState.fresh(sid, start.stages.get(sid)) for sid in self._order_ids()
        }
        self._order = max((s.order or 0 for s in self._stages.values()), default=0)
        if start.continued:
            self._parked = start.parked
            # the events of the previous execution's last task: handed over by this one's
            # first (``StartDocument.continue_carries_events``)
            self._outbox = [dict(e) for e in start.outbox]
            self._deliveries = {**start.deliveries, **self._deliveries}
        self._carry_signals(start)  # (after the deliveries: a signal sent twice is known)
        if self._hands_events and start.continue_after:
            self._continue_after = start.continue_after

    def _order_ids(self) -> list[str]:
        return [sid for group in self._graph.groups for sid in group]

    async def _execute(self) -> None:
        for group in self._graph.groups:
            todo = [s for s in group if self._stages[s].status != "completed"]
            if todo:
                await self._run_group(todo)

    async def _run_group(self, todo: list[str]) -> None:
        """Run one execution group's stages in parallel. The first stage that fails for good
        stops the others at once (DESIGN §5, a failure inside a parallel group), and so does a
        cancel or a run timeout (this task is cancelled): see ``_stop``. Every stage attempt
        has reported before this returns or raises."""
        tasks = {sid: asyncio.create_task(self._guarded(sid)) for sid in todo}
        self._group_tasks = tasks

        def failed() -> bool:
            return any(isinstance(_outcome(t), _StageFailed) for t in tasks.values())

        try:
            await workflow.wait_condition(lambda: failed() or all(t.done() for t in tasks.values()))
        except asyncio.CancelledError:
            # the run was cancelled (or timed out): stop the group, then end as cancelled
            self._stop(tasks, "cancelled")
            await self._settle(tasks)
            self._cancel_active()
            raise
        if not all(t.done() for t in tasks.values()):
            self._stop(tasks, "failed")
        cancelled = await self._settle(tasks)
        if self._stop_reason is not None:
            self._cancel_active()  # the stages the stop ended (never a migrated run's)
        if cancelled:
            raise asyncio.CancelledError()
        outcomes = [_outcome(tasks[sid]) for sid in todo]
        failures = [o for o in outcomes if isinstance(o, _StageFailed)]
        if failures:
            raise min(failures, key=lambda f: f.seq)
        for o in outcomes:
            if isinstance(o, BaseException):
                raise o

    async def _guarded(self, sid: str) -> BaseException | None:
        """One stage of a group, its outcome returned rather than raised (``_Stopped`` when
        ``_stop`` ended it: the stage is left running or suspended for ``_cancel_active``)."""
        try:
            await self._run_stage(sid)
        except _StageFailed as failed:
            self._failures += 1
            failed.seq = self._failures
            return failed
        except asyncio.CancelledError as exc:
            return _Stopped() if self._stop_reason is not None else exc
        except _Stopped as stopped:
            return stopped
        except Exception as exc:  # Migrated, or a bug: raised by _run_group once all settled
            return exc
        finally:
            self._unlend(sid)  # a signal its resumed wait reserved but no attempt ran for
        return None

    def _stop(self, tasks: dict[str, asyncio.Task[BaseException | None]], reason: str) -> None:
        """Stop every unfinished stage of the group. A stage whose attempt runs as an activity
        has the activity cancelled (WAIT_CANCELLATION_COMPLETED: its outcome is awaited, see
        ``_run_stage``); any other (suspended on a signal or a timer, between retries) has its
        task cancelled."""
        self._stop_reason = self._stop_reason or reason
        for sid, task in tasks.items():
            if task.done():
                continue
            handle = self._attempts.get(sid)
            if handle is not None:
                if not handle.done():
                    handle.cancel()
            else:
                task.cancel()

    async def _settle(self, tasks: dict[str, asyncio.Task[BaseException | None]]) -> bool:
        """Wait until every stage of the group reported; True when a cancel of the run
        arrived meanwhile (the run then ends cancelled once compensated)."""
        cancelled = False
        while True:
            try:
                await workflow.wait_condition(lambda: all(t.done() for t in tasks.values()))
                return cancelled
            except asyncio.CancelledError:
                cancelled = True
                self._stop(tasks, "cancelled")

    # -- one stage --------------------------------------------------------------------------
    async def _run_stage(self, sid: str) -> None:
        st = self._stages[sid]
        ahead = self._ahead.pop(sid, None)
        fresh = ahead is not None or await self._resume_imported(sid)
        next_attempt = max(1, st.attempt)
        if st.status == "pending" and st.attempt > 0:
            next_attempt = st.attempt + 1  # imported between attempts: the retry is due
        # whether the attempt about to be tried is new (a first try, a retry, a redrive) as
        # opposed to one that ran before (it suspended, or it was imported mid-attempt): the
        # activity logs "stage started" or "stage resumed" by it, as the native driver does
        new_attempt = fresh
        known: dict[str, Any] = {}  # the ledger before the try (a withdrawn one: what it added)
        while True:
            if ahead is None:
                async with self._slot():
                    if self._slots is not None and (self._failures or self._stop_reason):
                        # a sibling failed for good while this stage waited for the slot it
                        # freed (the stop follows): it never starts, as a native queued job
                        raise _Stopped()
                    await self._gate()
                    await self._repin_gate()  # (``_repin``: no yield unless one waits)
                    attempt = next_attempt if fresh else st.attempt
                    self._begin_stage(sid, attempt, fresh)
                    known = dict(st.steps)
                    res = self._gated(sid) if new_attempt else None
                    if res is None:
                        res = await self._call(sid, attempt, compensation=False, new=new_attempt)
            else:  # it ran already, in the local chain of a stage before it (``_chain``)
                attempt, res, ahead = 1, self._ran_ahead(sid, ahead), None
            if self._stop_reason is not None and not (
                res["kind"] == "completed"
                and (
                    self._stop_reason == "failed" or bool(res.get("chained") or res.get("went_on"))
                )
            ):
                # the run stops: an attempt that came back anyway (it suspended, failed or
                # ignored the cancel) ends cancelled; one that returned after a sibling failed
                # is completed and compensated (DESIGN §5), a late result of a cancel discarded
                # (one a local chain went on from had completed before the chain heard of it)
                raise _Stopped()
            if res["kind"] == "cancelled":  # (a chained stage: only ever after a stop)
                raise asyncio.CancelledError()
            kind = res["kind"]
            if kind == "completed":
                self._stage_completed(sid, attempt, res)
                return
            fresh = False
            if kind == "withdrawn":
                # a freeze took the activity before any worker did: the attempt started and
                # nobody runs it (a snapshot shows it running; its target continues it);
                # back to the gate, and the same attempt is scheduled again if unfrozen
                # (it ran before if a lost worker's try of it journaled steps)
                if any(known.get(r["name"]) != r for r in res.get("steps") or ()):
                    new_attempt = False
                continue
            if kind == "suspended":
                new_attempt = False
                await self._stage_suspended(sid, attempt, res)
                continue
            await self._stage_failed(sid, attempt, res)  # raises _StageFailed when final
            next_attempt = attempt + 1
            fresh = new_attempt = True

    def _gated(self, sid: str) -> dict[str, Any] | None:
        """The try of a new attempt of a stage that starts on a signal (``after_signal``)
        when no such signal is there: the attempt suspends on it in the workflow, as its
        body's gate would (``Steps._gate``: no step journaled), and no activity runs until
        the signal came (one activity per attempt, as a hand-written ``wait_condition``
        before an activity); None: the try runs as an activity."""
        spec = self._graph.stage(sid)
        name = spec.after_signal
        if name is None or name in self._stages[sid].steps or self._signal_ready(name):
            return None
        if self._locals or self._local_ended == workflow.info().get_current_history_length():
            # a local activity holds (or held) this workflow task: a signal sent while it ran
            # reaches the run only once the task ends, so the workflow cannot tell whether the
            # signal came before the stage started; the activity asks the run for it
            # (``wfe.internal.take_signal``), as a wait in the body does
            return None
        until = None
        if spec.after_signal_timeout_s is not None:
            # the wait's deadline, journaled as the gate's step would (``Steps._gate``): the
            # try that runs once it passed fails the attempt with StepTimeoutError
            deadline = self._now() + timedelta(seconds=spec.after_signal_timeout_s)
            until = _iso(deadline)
            self._stages[sid].steps[name] = record_to_json(
                StepRecord(name, "signal", completed=False, deadline=deadline, signal=name)
            )
        return {
            "kind": "suspended",
            "reason": "signal",
            "waiting_for": f"signal:{name}",
            "until": until,
            "step": name,  # (the gate's step: ``Steps._gate``)
        }

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """Held by a stage attempt from its start until its try returns: at most
        ``StartDocument.stage_activities`` attempts of the run in flight, the others pending
        until one ends (in the order they asked). A free slot is taken without yielding, so a
        run that never reaches the bound issues the commands it did before the bound."""
        return self._slots if self._slots is not None else contextlib.nullcontext()

    async def _resume_imported(self, sid: str) -> bool:
        """Whether the stage's next attempt is a fresh one. A run imported mid-attempt
        continues that attempt (no second stage.started), once its wait is over."""
        st = self._stages[sid]
        if not (st.status in ("suspended", "running") and st.attempt > 0):
            return True
        if st.status == "suspended" and st.waiting_for:
            # (suspended where the run came from: imported, or continued as new)
            self._suspension_noted(sid, *self._current_wait(st))
            waiting_for: str = st.waiting_for
            reason = waiting_for.split(":", 1)[0]
            if reason not in ("sleep", "signal", "poll"):
                reason = "sleep" if st.wake_at else "signal"
            await self._wait(
                sid, {"reason": reason, "waiting_for": waiting_for}, parse_time(st.wake_at)
            )
        return False

    def _stage_completed(self, sid: str, attempt: int, res: dict[str, Any]) -> None:
        self._order += 1
        st = self._stages[sid]
        st.status = "completed"
        st.output = res.get("output")
        st.events = res.get("events") or []
        st.error = None
        st.finished_at = _iso(self._now())
        st.order = self._order
        st.waiting_for = None
        st.wake_at = None
        self._emit(self._lc.stage_completed(sid, attempt))
        self._sync()

    async def _stage_suspended(self, sid: str, attempt: int, res: dict[str, Any]) -> None:
        """Record the suspension, then wait until the attempt may resume."""
        st = self._stages[sid]
        st.suspensions += 1
        until = parse_time(res.get("until"))
        st.status, st.waiting_for, st.wake_at = "suspended", res["waiting_for"], res["until"]
        self._suspension_noted(sid, res.get("step"), res["until"], res["waiting_for"])
        self._emit(
            self._lc.stage_suspended(
                sid,
                attempt,
                # (None: a result recorded before 2026-12-06, or a run started before)
                res.get("step") if self._start.suspensions_by_step else None,
                st.suspensions,
                res["reason"],
                until,
                res["waiting_for"],
            )
        )
        self._sync()
        await self._wait(sid, res, until)

    def _suspension_noted(
        self, sid: str, step: str | None, until: str | None, waiting_for: str | None
    ) -> None:
        """Keep the wait of the attempt's last ``stage.suspended`` for a snapshot
        (``SnapshotStage.suspended_in``: an attempt a signal resumed, exported running at
        that wait, is imported suspended there, ``at_its_wait``). Only in memory: the
        snapshot is an update's result, no command, so runs started before replay as they
        did. ``step`` None: not known (a result recorded before 2026-12-06, or a suspended
        stage whose journal does not say), and the snapshot does not say either."""
        if step is None or waiting_for is None:
            self._suspended_in.pop(sid, None)
        else:
            self._suspended_in[sid] = {"step": step, "until": until, "waiting_for": waiting_for}

    def _current_wait(self, st: StageState) -> tuple[str | None, str | None, str | None]:
        """(step, until, waiting_for) of the wait ``st``, a suspended stage this execution
        took over, is in (``current_wait``, the port's rule); step None: not known."""
        try:
            stage = SnapshotStage.model_validate(
                {
                    "id": st.id,
                    "status": st.status,
                    "attempt": st.attempt,
                    "suspensions": st.suspensions,
                    "waiting_for": st.waiting_for,
                    "wake_at": st.wake_at,
                    "steps": list(st.steps.values()),
                }
            )
        except ValueError:  # (a journal of a form it does not read: the snapshot won't say)
            return None, None, None
        wait = current_wait(stage)
        if wait is None:
            return None, None, None
        return wait.step, st.wake_at, wait.waiting_for

    async def _stage_failed(self, sid: str, attempt: int, res: dict[str, Any]) -> None:
        """Record the failed attempt; back off before the retry, or raise ``_StageFailed``
        when the stage failed for good."""
        st = self._stages[sid]
        error = res["error"]
        will_retry = (
            bool(res.get("retryable")) and attempt < self._graph.stage(sid).retry.max_attempts
        )
        self._emit(self._lc.stage_failed(sid, attempt, ErrorInfo(**error), will_retry))
        st.error = error
        if not will_retry:
            st.status, st.finished_at = "failed", _iso(self._now())
            self._sync()
            raise _StageFailed(error)
        st.backoff = True  # (shown pending until the retry begins)
        self._sync()
        await self._pause(self._delay(sid, attempt), f"retry {sid}")

    def _begin_stage(self, sid: str, attempt: int, fresh: bool) -> None:
        """The attempt starts (``fresh``: stage.started, written to the memo) or a suspended
        one resumes."""
        st = self._stages[sid]
        st.backoff = False
        if fresh:
            st.attempt = attempt
            if not self._run_started:
                self._run_started = True
                self._emit(self._lc.run_started())
            st.status = "running"
            st.started_at = _iso(self._now())
            st.finished_at = None
            st.suspensions = 0
            st.waiting_for = None
            st.wake_at = None
            self._suspended_in.pop(sid, None)
            self._emit(self._lc.stage_started(sid, attempt))
            self._sync()
        else:
            st.status, st.waiting_for, st.wake_at = "running", None, None

    def _retimed(self, was: datetime, live: datetime) -> None:
        """(``_clock``: a replay that ran an activation at ``was`` where the live run read
        ``live``.) The stage times and the run's set then are ``live``, and so is the run's
        deadline if it was computed then (its first task)."""
        old, new = _iso(was), _iso(live)
        for st in self._stages.values():
            if st.started_at == old:
                st.started_at = new
            if st.finished_at == old:
                st.finished_at = new
        if self._finished_at == old:
            self._finished_at = new
        timeout = timedelta(seconds=self._graph.timeout_s or 0)
        if timeout and self._start.deadline is None and self._deadline == _iso(was + timeout):
            self._deadline = _iso(live + timeout)

    def _delay(self, sid: str, attempt: int) -> float:
        # a Temporal timer needs a positive duration
        return max(self._graph.stage(sid).retry.delay_s(attempt), 0.001)

    def _remaining(self, until: Any) -> float | None:
        if until is None:
            return None
        return max(0.0, float((until - self._now()).total_seconds())) + 0.02

    async def _wait(self, sid: str, res: dict[str, Any], until: Any) -> None:
        """Wait until the suspended attempt of ``sid`` may resume: its signal is free (lent
        to it at once, see ``_reserve``), its timer or deadline is due. Meanwhile the run
        may continue as new (``_at_safe_point``)."""
        self._waits.add(sid)
        if until is not None:
            self._timer_s[sid] = (until - self._now()).total_seconds()
        try:
            await self._wait_on(sid, res, until)
        finally:
            self._waits.discard(sid)
            self._timer_s.pop(sid, None)
        self._waits_ended += 1

    def _passed(self, until: Any) -> bool:
        """Whether a wait this execution resumes is already due (an execution continued
        with ``StartDocument.due_at_once``): it ends at once rather than on a short timer,
        which would fire about a second late (``_TIMER_PRECISION``)."""
        return self._start.due_at_once and until is not None and until <= self._now()

    async def _wait_on(self, sid: str, res: dict[str, Any], until: Any) -> None:
        if res["reason"] == "signal" and not self._holder_rule:
            name = res["waiting_for"].split(":", 1)[1]
            # (a local try's suspension read back: it ran before, in a refused or lost
            # workflow task, see ``SignalHandlers._answer``; its window of answers)
            again = res.get("again")
            if not isinstance(again, int) or isinstance(again, bool):
                again = None
            while not self._reserve(sid, name, again):
                if self._passed(until):
                    return  # (timed out: as below)
                try:
                    await workflow.wait_condition(
                        lambda: self._signal_ready(name) or self._migrated_to is not None,
                        timeout=self._remaining(until),
                        timeout_summary=f"timeout of {res['waiting_for']}",
                    )
                except TimeoutError:
                    # one that arrived with the deadline still counts
                    self._reserve(sid, name, again)
                    return
                if self._migrated_to is not None:
                    raise Migrated()
            return
        remaining = self._remaining(until)
        if res["reason"] == "signal":  # a run with the holder rule (see ``SignalHandlers``)
            name = res["waiting_for"].split(":", 1)[1]
            if self._signal_ready(name):
                return
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._signal_ready(name) or self._migrated_to is not None,
                    timeout=remaining,
                    timeout_summary=f"timeout of {res['waiting_for']}",
                )
            if self._migrated_to is not None:
                raise Migrated()
        elif remaining is not None and not self._passed(until):
            await self._pause(remaining, res["waiting_for"])

    def _ancestors(self, sid: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self._graph.stage(sid).after)
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo.extend(self._graph.stage(d).after)
        return seen

    async def _call(
        self, sid: str, attempt: int, *, compensation: bool, new: bool | None = None
    ) -> dict[str, Any]:
        """Run one try of a stage attempt (or compensation) as an activity; ``withdrawn``
        when a freeze cancelled a stage activity no worker had picked up (it ran nothing).
        ``new``: whether the attempt is a new one (see ``_task``)."""
        st = self._stages[sid]
        steps = st.comp_steps if compensation else st.steps
        # the patch marker keeps runs started before local stages existed replaying
        in_process = bool(self._graph.stage(sid).local) and self._patched(_LOCAL_PATCH)
        task = self._task(
            sid, attempt, steps, compensation=compensation, in_process=in_process, new=new
        )
        mark = self._local_mark(task) if in_process else None
        chain = self._chain(sid) if in_process and not compensation else []
        if chain:
            task["chain"] = chain
        call: dict[str, Any] | None = None
        if not compensation:
            self._inflight += 1
        res: dict[str, Any] | None = None
        if not (in_process or compensation):
            self._tokens += 1
            task["token"] = self._tokens
        # (runs with ``carry_budget``: a fan-out's inputs past it go to the BlobStore; a
        # local activity's input is no command)
        self._within_budget(task, None if in_process else self._start.carry_budget)
        carrier = self._carry_events(task)
        args, result_type = self._activity_args(task, compensation)
        try:
            if mark is not None:
                res = await self._call_local(
                    sid, attempt, args, result_type, compensation, chain, mark
                )
            else:
                handle = self._start_stage_activity(sid, attempt, args, result_type, compensation)
                if not compensation:
                    call = {"token": self._tokens, "handle": handle, "withdrawn": False}
                    self._calls[sid] = call
                    self._attempts[sid] = handle
                res = self._activity_result(await handle)
        except (ActivityError, ApplicationError) as exc:
            # (a failed local activity of this driver surfaces as its ApplicationError)
            cause = exc.cause if isinstance(exc, ActivityError) else exc
            if isinstance(cause, CancelledError):
                if call is None or not call["withdrawn"]:
                    raise asyncio.CancelledError() from None
                # the freeze's cancel found it still scheduled; steps an earlier try
                # of a lost worker journaled go into the ledger the snapshot carries
                res = {"kind": "withdrawn", "steps": await self._journaled(sid)}
            else:
                res = _failed_try(sid, exc, cause)
        finally:
            self._call_ended(sid, call, carrier, res, compensation=compensation)
        assert res is not None
        chained = res.get("chained") or []
        for i, doc in enumerate(chained):
            # (a freeze waits until the run recorded them)
            self._ahead[doc["stage_id"]] = {**doc, "went_on": i < len(chained) - 1}
            self._inflight += 1
        self._took(sid, res, steps, compensation)
        return res

    def _took(
        self, sid: str, res: dict[str, Any], steps: dict[str, Any], compensation: bool
    ) -> None:
        """Keep what a try of ``sid`` reported: the steps it journaled, the signals it
        consumed."""
        for rec in res.get("steps") or ():
            steps[rec["name"]] = rec
        if not compensation:
            self._settle_lent(sid, res.get("consumed") or ())
            self._release_taken(sid, steps)

    def _local_mark(self, task: dict[str, Any]) -> LocalMark:
        """The scheduling of a local stage activity of ``task`` (``_clock``); on a run with the
        ``clock`` mark its task carries the run's clock, which the activity gives back (data
        of the activity's input only: a local activity's input is no command)."""
        mark = self._scheduling()
        if self._clock_from_locals:
            task["clock"] = mark.at.isoformat()
        return mark

    def _chain(self, sid: str) -> list[dict[str, Any]]:
        """The stages a ``local=True`` attempt of ``sid`` runs after it in its local activity,
        one after another while each completes (``_activities.ActivityHost._chain``): one
        local activity for a sequence of local stages (a no-op local stage costs the run
        ~2.5 ms of local activity round trip in its workflow task). Those are the stages of
        the groups after ``sid``'s, while each is alone in its group, ``local=True`` and
        not started; none when ``sid`` has siblings. Each link names the outputs it reads
        from before the chain (given) and from the chain (filled in as they come)."""
        if not self._chains:
            return []
        groups = self._graph.groups
        if self._group_of is None:
            self._group_of = {s: i for i, group in enumerate(groups) for s in group}
        at = self._group_of[sid]
        if len(groups[at]) != 1:
            return []
        links: list[dict[str, Any]] = []
        chained = {sid}
        for group in groups[at + 1 :]:
            nid = group[0]
            st = self._stages[nid]
            spec = self._graph.stage(nid)
            if len(group) != 1 or not spec.local or spec.after_signal is not None:
                break  # (a stage that starts on a signal waits in the workflow: _run_stage)
            if st.status != "pending" or st.attempt or nid in self._ahead:
                break
            before = self._ancestors(nid)
            links.append(
                {
                    "stage_id": nid,
                    "outputs": {a: self._stages[a].output for a in sorted(before - chained)},
                    "chained": sorted(before & chained),
                }
            )
            chained.add(nid)
        return links

    def _ran_ahead(self, sid: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Record that attempt 1 of ``sid`` started and ran in a local chain (``_chain``):
        its document, taken as the result of a try."""
        self._inflight -= 1
        self._begin_stage(sid, 1, True)
        self._took(sid, doc, self._stages[sid].steps, False)
        return doc

    def _flush_ahead(self) -> None:
        """The stages a local chain ran that the run stopped before recording (a cancel, the
        run's timeout): each completed one is recorded so (and compensated), the last one is
        the late result of the stop (it started; ``_cancel_active`` ends it cancelled)."""
        left = list(self._ahead.items())
        self._ahead.clear()
        for sid, doc in left:
            self._ran_ahead(sid, doc)
            if doc["went_on"]:
                self._stage_completed(sid, 1, doc)

    def _task(
        self,
        sid: str,
        attempt: int,
        steps: dict[str, Any],
        *,
        compensation: bool,
        in_process: bool,
        new: bool | None = None,
    ) -> dict[str, Any]:
        """What the stage activity needs: the run's values and the stage's ledger; ``new``
        (a stage attempt's try): whether the attempt is a new one."""
        st = self._stages[sid]
        task = {
            "run_id": self._run_id,
            "workflow_id": self._wf_id,
            "version": self._version,
            "stage_id": sid,
            "attempt": attempt,
            "redrive": self._journal,
            "input": self._start.input,
            "outputs": {a: self._stages[a].output for a in self._ancestors(sid)},
            "steps": list(steps.values()),
            "signal_queues": {} if compensation else self._lend(sid, in_process),
            "output": st.output if compensation else None,
            "trace_context": self._start.trace_context,
        }
        if self._start.case_safe_keys:
            # (its blob keys: ``_wire._part``; data of the activity's input only, absent in
            # the tasks of a run started before, whose journals stay where they are)
            task["keys"] = self._start.blob_keys
        if new is not None:
            # a new attempt (first try, retry, redrive): the ledger's steps are earlier
            # attempts', so its log line says "stage started", not "stage resumed"; data of
            # the activity's input only (no command changes: a replay is unaffected)
            task["new_attempt"] = new
        if in_process:
            # which try of the attempt this is: a local try's result is journaled under it
            # (``_activities._Recorded``), so a lost workflow task does not run it again
            task["try"] = 0 if compensation else st.suspensions
        if _was_reset(workflow.info(), self._start.continued):
            # an operator reset this run (a new execution of the same chain): the stage's
            # step journal may hold steps the replayed ledger lacks; the activity reads it
            task["reset"] = True
        return task

    def _timeout(self, sid: str) -> timedelta:
        """The StageRunner's effective timeout (the stage's own, else the starter's
        default_stage_timeout) plus a grace; one day when neither is set (Temporal needs
        one)."""
        timeout_s = self._graph.stage(sid).timeout_s or self._start.default_stage_timeout_s
        if timeout_s:
            return timedelta(seconds=timeout_s + _GRACE)
        return timedelta(days=1)

    async def _call_local(
        self,
        sid: str,
        attempt: int,
        args: list[Any],
        result_type: type[Any],
        compensation: bool,
        chain: list[dict[str, Any]],
        mark: LocalMark,
    ) -> dict[str, Any]:
        """A try of a ``local=True`` stage (and the stages ``chain``ed after it): a local
        activity, run by this worker, scheduled at ``mark`` (``_clock``)."""
        what = "compensation" if compensation else "attempt"
        name = sid + COMPENSATE_SUFFIX if compensation else sid
        summary = f"{sid} {what} {attempt}"
        timeout = self._timeout(sid)
        if chain:
            summary += ", then " + ", ".join(link["stage_id"] for link in chain)
            for link in chain:
                timeout += self._timeout(link["stage_id"])
        local = workflow.start_local_activity(
            name,
            args=args,
            result_type=result_type,
            start_to_close_timeout=timeout,
            retry_policy=_INFRA_RETRY,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=summary,
        )
        if not compensation:
            self._attempts[sid] = local
        self._locals += 1
        # (``SignalHandlers._local_window``: the answers this try, if read back, may deliver)
        task = workflow.info().get_current_history_length()
        # (a compensation never waits)
        waits = frozenset() if compensation else self._may_wait_for(sid, chain)
        window = self._local_window(task, waits)
        try:
            res = self._activity_result(await local)
        except (ActivityError, ApplicationError) as exc:
            reported = _reported(exc, timeout)
            if reported is not None:
                self._local_reported(mark, reported.get("took_s"), reported.get("clock"))
            raise
        finally:
            self._locals -= 1
            self._local_ended = workflow.info().get_current_history_length()
            self._tell_since(window)
        # (the run's clock from here on: ``_clock``)
        self._local_reported(mark, res.get("took_s"), res.get("clock"))
        for doc in (res, *(res.get("chained") or ())):
            if doc.get("again") is True:
                # a try read back (``_activities._Recorded``): its window of answers
                # (``SignalHandlers._delivered_late``)
                doc["again"] = window
        return res

    def _may_wait_for(self, sid: str, chain: list[dict[str, Any]]) -> frozenset[str] | None:
        """The signal names a local try of ``sid`` (and the stages ``chain``ed after it) may
        wait for: the ones they declare; None (any) when one of them declares none."""
        names: set[str] = set()
        for stage in (sid, *(link["stage_id"] for link in chain)):
            declared = self._graph.stage(stage).signals
            if not declared:
                return None
            names.update(declared)
        return frozenset(names)

    def _start_stage_activity(
        self,
        sid: str,
        attempt: int,
        args: list[Any],
        result_type: type[Any],
        compensation: bool,
    ) -> workflow.ActivityHandle[Any]:
        what = "compensation" if compensation else "attempt"
        name = sid + COMPENSATE_SUFFIX if compensation else sid
        return workflow.start_activity(
            name,
            args=args,
            result_type=result_type,
            start_to_close_timeout=self._timeout(sid),
            heartbeat_timeout=self._hb,
            retry_policy=_INFRA_RETRY,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"{sid} {what} {attempt}",
        )

    def _call_ended(
        self,
        sid: str,
        call: dict[str, Any] | None,
        carrier: int | None,
        res: dict[str, Any] | None,
        *,
        compensation: bool,
    ) -> None:
        """Bookkeeping once a try ended, however it ended."""
        self._carrier_done(carrier, None if res is None else res.get("published"))
        if call is not None and self._calls.get(sid) is call:
            del self._calls[sid]
        if compensation:
            return
        self._attempts.pop(sid, None)
        self._inflight -= 1
        if self._signal_holder == sid:
            self._signal_holder = None
        if res is None:  # no result (the run stops): what it took or was lent goes back
            self._release_taken(sid, {})
            self._unlend(sid)

    def _activity_args(
        self, task: dict[str, Any], compensation: bool
    ) -> tuple[list[Any], type[Any]]:
        """A stage activity's arguments and result type. A run of this driver passes the
        stage's business values, as a hand-written activity would: an attempt takes the run's
        input (then the outputs of the stages it comes after, when there are any), a
        compensation the stage's output and the run's input (then the same outputs); the rest
        of ``task`` rides in the first argument's payload metadata (``_carry``). An older run
        passes ``task``."""
        if not self._carried:
            return [task], dict
        business = ("input", "outputs", "output")
        meta = {k: v for k, v in task.items() if k not in business}
        conv = workflow.payload_converter()
        upstream = [task["outputs"]] if task["outputs"] else []
        if compensation:
            values = [task["output"], task["input"], *upstream]
        else:
            values = [task["input"], *upstream]
        return [carry(values[0], meta, conv), *values[1:]], RawValue

    def _activity_result(self, value: Any) -> dict[str, Any]:
        """What a stage activity reported: the old shape's document, or the output with the
        bookkeeping in its payload's metadata."""
        if not isinstance(value, RawValue):
            result: dict[str, Any] = value
            return result
        meta = meta_of(value.payload) or {}
        if meta.get("kind") == "completed":
            meta["output"] = workflow.payload_converter().from_payload(value.payload)
        return meta

    async def _journaled(self, sid: str) -> list[dict[str, Any]]:
        mark = self._scheduling()
        records: list[dict[str, Any]] = await workflow.execute_local_activity(
            READ_JOURNAL_ACTIVITY,
            args=[self._run_id, sid, self._journal]
            + ([self._start.blob_keys] if self._start.case_safe_keys else []),
            result_type=list,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=_STORE_RETRY,
        )
        self._local_reported(mark)  # (it reports no run time: ``_clock``)
        return records

    # -- saga -------------------------------------------------------------------------------
    def _cancel_active(self) -> None:
        self._flush_ahead()
        for sid in sorted(self._stages):
            st = self._stages[sid]
            if st.status in ("running", "suspended"):
                st.status, st.finished_at = "cancelled", _iso(self._now())
                st.waiting_for = st.wake_at = None  # (it waits for nothing any more)
                st.backoff = False
                self._emit(self._lc.stage_cancelled(sid))

    async def _compensate(self) -> None:
        if self._repin_due():  # (``_repin``: the pin moved; its compensations run there)
            self._apply_repin()
        self._status = "compensating"
        self._sync()
        done = [s for s in self._stages.values() if s.status == "completed" and s.order]
        for st in sorted(done, key=lambda s: s.order or 0, reverse=True):
            sid = st.id
            spec = self._graph.stage(sid)
            if not spec.compensable:
                continue
            attempt = 1
            while True:
                res = await self._call(sid, attempt, compensation=True)
                if res["kind"] == "completed":
                    st.status = "compensated"
                    self._emit(self._lc.stage_compensated(sid))
                    self._sync()
                    break
                if (
                    res["kind"] == "failed"
                    and res.get("retryable")
                    and attempt < spec.retry.max_attempts
                ):
                    await workflow.sleep(self._delay(sid, attempt), summary=f"retry {sid}")
                    attempt += 1
                    continue
                st.compensation_error = res.get("error")
                self._comp_errors.append(res.get("error") or {})
                break

    async def _finish(self, outcome: str, error: dict[str, Any] | None) -> None:
        if outcome == "migrated":
            # the run lives on its target now; this copy ends here, frozen as it was exported
            assert self._migrated_to is not None
            self._emit(self._lc.run_migrated(self._migrated_to, self._seq + 1))
            self._status = "migrated"
            self._final = True
            self._frozen = False
            self._finished_at = _iso(self._now())
            self._sync()
            return
        # its last events ride with wfe.save_state below, not with a wfe.publish of their own
        self._finishing = self._via_activities
        for st in self._stages.values():
            if st.status == "pending":
                st.status = "skipped"
        if outcome == "completed":
            done = [s for s in self._stages.values() if s.order]
            for st in sorted(done, key=lambda s: s.order or 0):
                for i, e in enumerate(st.events):
                    self._emit(self._lc.business(st.id, i, e["type"], e["data"]))
            self._emit(self._lc.run_completed())
        elif outcome == "failed":
            assert error is not None
            self._error = error
            self._emit(self._lc.run_failed(ErrorInfo(**error)))
        else:
            self._emit(self._lc.run_cancelled())
        for st in self._stages.values():
            # released on completion, discarded by compensation or cancel: either way they are
            # gone, so a later redrive never emits them again (stages it re-runs emit anew)
            st.events = []
        self._status = outcome
        self._final = True
        self._refuse_unheard(outcome)
        self._finished_at = _iso(self._now())
        self._sync()
        if self._ends_on_worker:
            self._record_end(self._state())  # (``_run_end``: no local activity)
            return
        # (a run of the older rules delivers its last events with it: ``_outbox``)
        last = self._last_events()
        saved = await workflow.execute_local_activity(
            "wfe.save_state",
            args=[self._run_id, self._state(), *last],
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=_STORE_RETRY,
        )
        if last:
            self._finishing = False
            if isinstance(saved, dict):
                self._confirm(saved, bool(last[1]))

    def _state(self) -> dict[str, Any]:
        """Everything a redrive needs."""
        return {
            "run_id": self._run_id,
            "workflow_id": self._wf_id,
            "version": self._version,
            "input": self._start.input,
            "idempotency_key": self._start.idempotency_key,
            "fingerprint": self._start.fingerprint,
            "created_at": self._start.created_at,
            "redrive": self._redrive,
            "redrive_history": self._redrive_history,
            "event_seq": self._seq,
            "status": self._status,
            "stages": {sid: st.to_json() for sid, st in self._stages.items()},
            "signals": self._signals,
            "signal_keys": sorted(self._signal_keys),
            "run_started": self._run_started,
        }


def _was_reset(wfi: workflow.Info, continued: bool) -> bool:
    """Whether this execution is an operator's reset of the run (of its first execution or of
    one it continued as new in): its started event is a copy of the reset one's, so it names
    another execution as the one it was written for. A server that leaves that field empty:
    an execution other than the chain's first that did not continue as new (a reset of a
    continued execution then goes unseen)."""
    original = wfi.original_execution_run_id
    if original:
        return wfi.run_id != original
    return wfi.run_id != wfi.first_execution_run_id and not continued
