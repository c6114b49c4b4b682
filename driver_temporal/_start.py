"""The start document of a run: everything the interpreter workflow needs besides the run's
input (which is the workflow's input), kept in the ``wfe_start`` memo entry and, on runs started
since 2026-12-03, the workflow input's metadata: the graph and where each stage is
(``CARRIED``, which grow with the graph) ride with the input payload, out of sight in the Web
UI, and the memo keeps the settings and marks. Temporal keeps a run's memo in its mutable state
and writes it again with every change of the run (each activity scheduled, started, completed):
a 52-stage graph in the memo was 15 KB written ~150 times per run, ~50 ms of dev server CPU per
run of the 1 -> 50 -> 1 fan-out (``bench/README.md``). The input is written once.

One typed model, built by ``StartDocument.for_engine`` for a new run (``start``), a redrive and
an import, and read by the workflow (``GraphWorkflow.run``). It reads every older shape: runs
started before a key existed lack it, and the default is what the code of their time did, so
their histories replay (the sink retry rule of runs started before it: ``OLD_OUTBOX_RULE``; no
``events_via`` / ``names`` marks: events published per workflow task, older handler names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_serializer

from ._names import NAMES_MARK
from ._state import StageState
from ._wire import (
    BLOB_KEYS_CASE_SAFE,
    CARRY_BUDGET,
    CLOCK_FROM_LOCALS,
    CONTINUE_HOLDS_TIMERS,
    EVENTS_VIA_ACTIVITIES,
    EVENTS_VIA_ONE_CARRIER,
    LOCAL_CHAINS,
    MEMO_SHAPE_COMPACT,
    MEMO_WRITES_AFTER_LOCALS,
    MEMO_WRITES_ON_CHANGE,
    OLD_OUTBOX_RULE,
    PARKING_WHEN_SLOW,
    PUBLISH_BY_WORKER,
    RESULT_WITH_RUN_INFO,
    RUN_END_BY_WORKER,
    SIGNALS_CHECKED,
    STAGE_ATTRIBUTE_WAITS,
    SUSPENSION_IDS_BY_STEP,
    TAKES_PER_EXECUTION,
)

if TYPE_CHECKING:
    from engine_port import EngineSettings

__all__ = ["CARRIED", "StartDocument", "declared_signals"]

# the keys that ride in the input payload's metadata (``StartDocument.carried``), not the memo
CARRIED = frozenset(
    {"graph", "stages", "redrive_history", "signals", "signal_keys", "deliveries", "outbox"}
)


class StartDocument(BaseModel):
    """A run's start document (see the module docstring)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: str
    workflow_id: str
    version: str
    graph: dict[str, Any]
    input: Any = None  # the stored form (inline or a claim-check reference)
    idempotency_key: str | None = None
    fingerprint: str | None = None
    created_at: str | None = None
    trace_context: str | None = None
    # the starting engine's settings
    heartbeat_timeout_s: float = 10.0
    default_stage_timeout_s: float | None = None
    max_pending_signals: int | None = None
    # the sink retry rule (the native outbox's); a run started before it: the old rule
    dead_letter_after: int = int(OLD_OUTBOX_RULE["dead_letter_after"])
    dead_letter_min_seconds: float = float(OLD_OUTBOX_RULE["dead_letter_min_seconds"])
    outbox_retry_initial_seconds: float = float(OLD_OUTBOX_RULE["outbox_retry_initial_seconds"])
    outbox_retry_max_seconds: float = float(OLD_OUTBOX_RULE["outbox_retry_max_seconds"])
    # what the starting driver does (``for_engine``); absent on runs started before
    events_via: str | None = None
    names: str | None = None
    memo_writes: str | None = None
    result: str | None = None
    stage_attribute: str | None = None
    parking: str | None = None
    run_end: str | None = None
    memo_shape: str | None = None
    publish: str | None = None
    local: str | None = None
    signal_rule: str | None = None
    continue_hold: str | None = None
    suspension_ids: str | None = None
    blob_keys: str | None = None
    clock: str | None = None
    # the starting engine's ``spill_threshold_bytes`` (runs with ``signal_rule``: what an
    # operator's raw signal is stored inline up to)
    spill_threshold: int | None = None
    # the signal names the graph's stages declare (runs started since 2026-12-05): an
    # operator's raw signal of another name is rejected and recorded, as ``engine.signal``
    # refuses it (``SignalHandlers.on_signal``). In the memo, so that a signal handled before
    # the run's ``run`` reads it; None: any name is queued (a graph that declares none, or a
    # run started before)
    signal_names: list[str] | None = None
    # the most stage activities in flight at once (``GraphWorkflow._slot``); None: a run
    # started before the bound, whose stages all start at once as they did
    stage_activities: int | None = None
    # a redrive, an import: where the run picks up
    redrive: int = 0
    redrive_from: str | None = None
    redrive_history: list[dict[str, Any]] = []
    event_seq: int = 0
    stages: dict[str, StageState] = {}  # where each stage is (absent: pending)
    signals: list[dict[str, Any]] | dict[str, Any] = []  # (a dict: one per name, older runs)
    signal_keys: list[str] = []
    run_started: bool = False
    deadline: str | None = None
    imported: bool = False
    # continue-as-new (runs started since 2026-12-05 with ``continue_after``): once its
    # history holds that many events (or Temporal suggests it) and the run is at a safe point
    # (every stage in flight waits on a timer, a signal or a poll), the run goes on in a new
    # execution of its workflow id (``GraphWorkflow._continue``), whose start document carries
    # its state (``continued``: no run.created, event numbers go on); None: never
    continue_after: int | None = None
    continued: bool = False
    parked: bool = False  # (continued) events kept in the BlobStore by a sinkless worker
    # (continued) what became of the last signals the run was sent, by delivery id, so that
    # ``TemporalEngine.signal`` asking right after a continue-as-new hears about its signal
    deliveries: dict[str, dict[str, Any]] = {}
    # (continued since 2026-12-06) a wait whose time already passed when this execution
    # resumes it ends at once, with no timer (``GraphWorkflow._passed``); an execution an
    # older driver continued set a short timer, and replays so
    due_at_once: bool = False
    # (continued since 2026-12-06) the signals this execution's first task handles before
    # the run set up are judged against ``max_pending_signals`` once the queue carried over
    # is loaded (``SignalHandlers._carry_signals``); an execution an older driver continued
    # queued them all, and replays so
    bounds_early: bool = False
    # (runs started, or continued, since 2026-12-06) the signal a resumed wait was lent
    # (``SignalHandlers._reserve``: delivered to it, which consumes it on the native driver)
    # does not count toward ``max_pending_signals`` while its attempt runs; a run started
    # before counted it until the attempt reported, and replays so
    frees_taken: bool = False
    # (runs started since 2026-12-06) the most bytes of business values the stage activities
    # of one workflow task carry inline; past it the larger ones go to the BlobStore behind a
    # reference (``_budget.CarryBudget``); None: a run started before, which carries them all
    carry_budget: int | None = None
    # (runs started since 2026-12-06) the signals a run's FIRST execution handles before it
    # set up (its first workflow task, e.g. sent while no worker ran) are judged against
    # ``max_pending_signals`` too, as ``bounds_early`` has continued executions do
    # (``SignalHandlers._carry_signals``), and ``TemporalEngine.signal`` reads their fate
    # from the run's history while its first task has not started (``_early.judged``); a run
    # started before queued them all (a burst to a pending run exceeded the bound), and
    # replays so
    bounds_first: bool = False
    # (runs started since 2026-12-06, with ``continue_after``) once an execution handled
    # that many takes (an execution receives at most 2,000 updates by default, and each
    # signal a running attempt takes is one), or Temporal suggests continuing as new, a take
    # answers nothing and no wait resumes for a signal: the attempt suspends, the run reaches
    # a safe point and continues, and the wait resumes in the new execution
    # (``SignalHandlers._takes_held``); None: a run started before, whose attempt went on
    # taking until Temporal refused the update
    takes_per_execution: int | None = None
    # (runs started since 2026-12-06) a cancellation request that reaches the run while it is
    # frozen for a move (an operator's ``temporal workflow cancel``, or ``cancel()`` racing
    # the freeze) does not cancel it: the run stays frozen and its move goes on; the cancel
    # is deferred, and applied only if the move is aborted (the run stays here), and a freeze
    # is refused once a cancel reached the run (``GraphWorkflow._watched``); a run started
    # before ended cancelled while its move went on (live and uncancelled on the target),
    # and replays so
    defers_frozen_cancel: bool = False
    # (runs started since 2026-12-06, with ``continue_after``) the events of the workflow
    # task that continues the run as new are not handed to the worker in that task: they
    # ride to the new execution (``outbox``), whose first task hands them over. Temporal
    # refuses the completion of a continuing task when a signal, update or cancel reached
    # the run while it ran (UnhandledCommand), and the task runs again with it, maybe on
    # another path (a gated stage that now finds its signal runs instead of suspending):
    # events the refused task had handed over were then numbered again for other events,
    # two events of one sequence number at the sink. A run started before handed them over
    # before continuing, and replays so
    continue_carries_events: bool = False
    # (runs started since 2026-12-06 late) a redrive(version=...) of the run while it is pending or
    # suspended re-pins it in place (``_repin``): the ``wfe.internal.repin`` update holds its
    # stage attempts, the engine moves the execution's pinned Worker Deployment version, and
    # the first workflow task of the new version's worker takes the new graph, emits
    # run.redriven and goes on, nothing re-run. A run started before has no such handler (its
    # history replays unchanged) and is re-pinned by a restart, or refused when that would
    # lose something (``TemporalEngine._refuse_lossy_repin``)
    repins_in_place: bool = False
    # (continued, ``continue_carries_events``) the events the previous execution emitted in
    # its last task, not delivered yet (oldest first)
    outbox: list[dict[str, Any]] = []
    # (runs started since 2026-12-06 late) a cancellation request that reaches the run once its
    # end is decided (every stage completed, or one failed for good with no stage of its
    # group in flight) is too late: the run ends as decided (``GraphWorkflow._end_decided``).
    # The workflow task that ends a run hands its last events over while it runs; when a
    # cancel reached the run meanwhile, Temporal refuses that task's completion
    # (UnhandledCommand) and runs it again with the cancel: a run started before ended
    # cancelled then, its refused run.completed already at the sink with the seq of the
    # run.cancelled, and replays so
    end_beats_cancel: bool = False

    @classmethod
    def for_engine(
        cls, settings: EngineSettings, heartbeat_timeout_s: float, **fields: Any
    ) -> StartDocument:
        """A start document for a run this engine starts now: its settings, its sink retry
        rule and the driver's marks, with ``fields`` (run id, graph, input, ...)."""
        return cls(
            heartbeat_timeout_s=heartbeat_timeout_s,
            default_stage_timeout_s=settings.default_stage_timeout,
            max_pending_signals=settings.max_pending_signals,
            frees_taken=True,
            carry_budget=CARRY_BUDGET,
            bounds_first=True,
            takes_per_execution=TAKES_PER_EXECUTION,
            defers_frozen_cancel=True,
            continue_carries_events=True,
            end_beats_cancel=True,
            repins_in_place=True,
            dead_letter_after=settings.dead_letter_after,
            dead_letter_min_seconds=settings.outbox_dead_letter_min_seconds,
            outbox_retry_initial_seconds=settings.outbox_retry_initial_seconds,
            outbox_retry_max_seconds=settings.outbox_retry_max_seconds,
            events_via=EVENTS_VIA_ONE_CARRIER,
            names=NAMES_MARK,
            memo_writes=MEMO_WRITES_ON_CHANGE,
            result=RESULT_WITH_RUN_INFO,
            stage_attribute=STAGE_ATTRIBUTE_WAITS,
            parking=PARKING_WHEN_SLOW,
            run_end=RUN_END_BY_WORKER,
            memo_shape=MEMO_SHAPE_COMPACT,
            publish=PUBLISH_BY_WORKER,
            local=LOCAL_CHAINS,
            signal_rule=SIGNALS_CHECKED,
            continue_hold=CONTINUE_HOLDS_TIMERS,
            suspension_ids=SUSPENSION_IDS_BY_STEP,
            blob_keys=BLOB_KEYS_CASE_SAFE,
            clock=CLOCK_FROM_LOCALS,
            spill_threshold=settings.spill_threshold_bytes,
            stage_activities=settings.temporal_max_stage_activities,
            signal_names=declared_signals(fields.get("graph")),
            **fields,
        )

    @field_serializer("stages")
    def _stages_as_given(self, stages: dict[str, StageState]) -> dict[str, dict[str, Any]]:
        # each entry as it was given (``StageState.to_json``), never with its defaults
        # filled in nor dropped: the memo of older runs holds these very shapes
        return {sid: st.to_json() for sid, st in stages.items()}

    @property
    def events_via_activities(self) -> bool:
        """Its stage activities carry its events (``_outbox``)."""
        return self.events_via in (EVENTS_VIA_ACTIVITIES, EVENTS_VIA_ONE_CARRIER)

    @property
    def one_carrier(self) -> bool:
        """At most one of its activities in flight carries events at a time (``_outbox``)."""
        return self.events_via == EVENTS_VIA_ONE_CARRIER

    @property
    def memo_after_locals(self) -> bool:
        """It writes its memo and search attributes only when no local activity is in
        flight (``_inspection.RunInspection._syncer``)."""
        return self.memo_writes in (MEMO_WRITES_AFTER_LOCALS, MEMO_WRITES_ON_CHANGE)

    @property
    def memo_on_change(self) -> bool:
        """It writes its memo only when what a reader of the memo alone acts on changes
        (``_inspection.RunInspection._memo_key``); its stages in between are the run's to
        tell (``RunMemo.stages_lag``)."""
        return self.memo_writes == MEMO_WRITES_ON_CHANGE

    @property
    def result_run_info(self) -> bool:
        """Its completion result carries its final RunInfo memo in the payload's metadata
        (``GraphWorkflow._result``; ``TemporalEngine.wait`` reads it)."""
        return self.result == RESULT_WITH_RUN_INFO

    @property
    def stage_attribute_waits(self) -> bool:
        """Its ``WfeStage`` names the stages it waits in (suspended) or failed in, not those
        that merely run, so a run whose stages just run writes its search attributes only when
        its status changes (``_inspection.RunInspection._write_info``)."""
        return self.stage_attribute == STAGE_ATTRIBUTE_WAITS

    @property
    def parks_when_slow(self) -> bool:
        """A sinkless worker's stage activity parks the events it carries only once its stage
        has run a while, and hands a fast stage's back to the run (``_outbox``)."""
        return self.parking == PARKING_WHEN_SLOW

    @property
    def ends_on_worker(self) -> bool:
        """Its last workflow task has its worker record its end (final state, last events)
        without a local activity (``_run_end``)."""
        return self.run_end == RUN_END_BY_WORKER

    @property
    def publishes_on_worker(self) -> bool:
        """The events none of its activities carries are handed to the worker running the
        workflow task, not published by the ``wfe.publish`` local activity (``_outbox``)."""
        return self.publish == PUBLISH_BY_WORKER

    @property
    def chains_locals(self) -> bool:
        """Its consecutive ``local=True`` stages run as one local activity
        (``GraphWorkflow._chain``)."""
        return self.local == LOCAL_CHAINS

    @property
    def checks_signals(self) -> bool:
        """It refuses signals once it winds down (compensating), and keeps an operator's
        signal over ``spill_threshold`` in the BlobStore (``SignalHandlers.on_signal``)."""
        return self.signal_rule == SIGNALS_CHECKED

    @property
    def holds_for_timers(self) -> bool:
        """It holds a continue-as-new while a wait's timer of a second or more is about due
        (``GraphWorkflow._due_before_next``): started with ``continue_hold``, or an execution
        continued by a driver that has the rule (``due_at_once``: its code never ran the
        old one). A run started before continues where its code did (a continue its history
        holds and the current rule would hold failed its replay: a nondeterminism error)."""
        return self.continue_hold == CONTINUE_HOLDS_TIMERS or self.due_at_once

    @property
    def suspensions_by_step(self) -> bool:
        """Its stage.suspended ids name the wait (step key and deadline); a run started
        before numbers them per attempt, also for the suspensions a result of the current
        code reports and the workflow's own (``_gated``): the events it delivered keep
        their ids when replayed or emitted again (a reset)."""
        return self.suspension_ids == SUSPENSION_IDS_BY_STEP

    @property
    def case_safe_keys(self) -> bool:
        """Its blob keys made of stage ids and step names are unique whatever the case
        (``_wire._part``); a run started before keeps finding its journals and spilled
        values where its code put them."""
        return self.blob_keys == BLOB_KEYS_CASE_SAFE

    @property
    def clock_from_locals(self) -> bool:
        """Its times in an activation where a local activity reported come from that local
        activity's own timing (``_clock.RunClock``), not the activation's; a run started
        before takes the activation's time, and replays so."""
        return self.clock == CLOCK_FROM_LOCALS

    @property
    def compact_memo(self) -> bool:
        """Its ``wfe_run`` memo lists each stage's set fields only (``StageState.memo``)."""
        return self.memo_shape == MEMO_SHAPE_COMPACT

    @property
    def marked(self) -> bool:
        """Started by this driver version or later: it declares only the ``wfe.internal.*``
        names and takes every workflow patch without a marker."""
        return self.names == NAMES_MARK

    def memo(self) -> dict[str, Any]:
        """The ``wfe_start`` memo entry: the document without the input and the ``CARRIED``
        keys, and without the keys at their defaults (read back as the same; the memo stays
        small: Temporal warns past 2 KiB, and writes it again at every change of the run)."""
        return self.model_dump(mode="json", exclude={"input", *CARRIED}, exclude_defaults=True)

    def carried(self) -> dict[str, Any]:
        """The ``CARRIED`` keys (those not at their defaults): the input payload's metadata."""
        return self.model_dump(mode="json", include=set(CARRIED), exclude_defaults=True)


def declared_signals(graph: Any) -> list[str] | None:
    """The signal names a graph (``GraphModel`` as JSON) declares, sorted; None when none."""
    stages = graph.get("stages") if isinstance(graph, dict) else None
    names = {str(n) for st in stages or () if isinstance(st, dict) for n in st.get("signals") or ()}
    return sorted(names) or None
