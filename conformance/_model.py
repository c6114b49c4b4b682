"""A reference model of the contract (DESIGN §5, SCENARIOS rules 1-7): a small, deterministic
interpreter that says what a generated :class:`Case` must produce on every driver.

It returns the observation the fuzzer compares: ``run_summary`` (status, stage statuses, error,
compensation errors), the run output, the normalised trace exactly as
``conformance._trace.normalise`` prints it (with runs of consecutive ``stage.cancelled`` sorted
by stage, see ``canonical``), execution counts (``body:<stage>`` per invocation of a body,
``step:<stage>.<step>`` per run of a step body, ``comp:<stage>`` per run of a compensation)
and the order compensations ran in.

A stage gated ``after_signal`` (``StageCase.gate``) waits as a body that begins with that wait
and no timeout, except that its body is not invoked before the signal (no ``body:`` count for
the suspension) and the gate journals nothing while it waits; a retry or a redrive of the stage
finds the signal journaled and passes at once. A ``timeout`` gate (``after_signal_timeout``,
never sent) suspends once, then its attempt fails with StepTimeoutError, and so does every
retry, without a suspension; the body never runs.

A ``race`` wait (``Wait.mode``) is a wait with a timeout whose signal the runner sends about
when the timeout falls: which comes first is up to timing, so the model is told what happened
(``races``: by the race wait's step key, see ``RACE_OUTCOMES``) and predicts everything else
from it; the signal is never lost: the race wait took it, or the timeout wait after it (its
``Wait.follows``) did, at once or once it suspended, or it stayed queued to the end of the run.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ._cases import Case, Emit, RunStep, Sleep, StageCase, Wait, groups_of, wait_keys

__all__ = [
    "FULL",
    "RACE_OUTCOMES",
    "Expected",
    "LateSignalRefused",
    "ModelError",
    "bounded_plan",
    "canonical",
    "early_signals",
    "expect",
    "signal_payload",
    "stage_output",
    "step_result",
]


class ModelError(Exception):
    """The case is outside what the model (and the contract) pins down, e.g. it would hang."""


class LateSignalRefused(ModelError):
    """A bounded case (``Case.bound``) whose runner would send a signal to a suspended wait
    while the run holds its bound of unconsumed signals: refused, the run would wait forever."""


# what ``engine.signal`` answers, in ``Expected.signals``, when it raises SignalQueueFullError
FULL = "full"

# what became of a race wait's signal (``Wait.mode == "race"``): the race wait took it
# (``took``); it timed out and the timeout wait after it took the signal at once
# (``queued``: it was queued by then), or suspended first and was then handed it (``late``:
# the signal came while the attempt was between the two waits), or timed out too (``left``:
# the signal came after both, it stays queued, or the run had ended and refused it)
RACE_OUTCOMES = ("took", "queued", "late", "left")


def early_signals(case: Case) -> list[tuple[str, str, str, str]]:
    """The signals the runner sends right after the start, in this order: (stage, signal
    name, mode, key) for each ``before`` gate (key: its ``gate_key``) and each ``before`` and
    ``during`` wait (key: its step key); ``conformance._fuzz.early_waits`` without the stage."""
    out: list[tuple[str, str, str, str]] = []
    for s in case.stages:
        if s.gate == "before":
            out.append((s.id, s.gate_signal, "before", s.gate_key))
        for op, key in zip(s.ops, wait_keys(s.ops), strict=True):
            if isinstance(op, Wait) and key is not None and op.mode in ("before", "during"):
                out.append((s.id, op.name, op.mode, key))
    return out


def bounded_plan(
    case: Case, refused: set[str] | None = None
) -> tuple[Case, dict[str, list[Any]], set[str]]:
    """For a bounded case (``Case.bound``): what the run does with its early signals. They
    are sent at start one after the other (a ``before`` one with its key, then again: a
    sender's retry), while nothing takes from the queue (``Case.bound``): each is queued while
    the run holds fewer than ``bound`` unconsumed signals, else refused (SignalQueueFullError,
    nothing queued: its key is not seen, so its retry is refused too); a retry of a queued
    one's key is ``already_completed`` however full the queue (DESIGN §5). Returns the case
    as it then runs (the wait or ``before`` gate of a refused signal suspends, and the runner
    sends its signal once it did: an ``after`` one), the answers to the early signals by name
    and the keys of the queued ones. ``refused``: the keys the engine did refuse (the runner
    goes on from what happened), default: those the contract says."""
    bound = case.bound
    answers: dict[str, list[Any]] = {}
    queued: set[str] = set()
    judged: set[str] = set()
    for _, name, mode, key in early_signals(case):
        full = (
            (key in refused)
            if refused is not None
            else (bound is not None and len(queued) >= bound)
        )
        got = answers.setdefault(name, [])
        if full:
            judged.add(key)
            got.extend([FULL, FULL] if mode == "before" else [FULL])
            continue
        queued.add(key)
        got.extend([[False, False], [False, True]] if mode == "before" else [[False, False]])

    def late(s: StageCase) -> StageCase:
        ops = tuple(
            replace(op, mode="after") if isinstance(op, Wait) and key in judged else op
            for op, key in zip(s.ops, wait_keys(s.ops), strict=True)
        )
        gate = "after" if s.gate == "before" and s.gate_key in judged else s.gate
        return replace(s, ops=ops, gate=gate)

    return replace(case, stages=tuple(late(s) for s in case.stages)), answers, queued


def signal_payload(key: str) -> dict[str, str]:
    """The payload the runner sends for the wait journaled as step ``key`` (``name``, or
    ``name#k`` for the k-th wait for one name, see ``wait_keys``): each wait of a repeated
    name gets its own, so a wait handed another one's signal shows in the output."""
    return {"sig": key}


def stage_output(stage: StageCase, attempt: int, got: list[Any]) -> dict[str, Any]:
    out = {"id": stage.id, "attempt": attempt, "deps": sorted(stage.after), "got": got}
    if stage.value is not None:
        out["value"] = json.loads(stage.value)
    return out


def step_result(stage: StageCase, key: str) -> Any:
    """What a durable step of the stage returns: its key, or the stage's value as it is (a
    bare number or string is stored differently from an object on some backends)."""
    return key if stage.value is None else json.loads(stage.value)


def canonical(trace: list[list[Any]]) -> list[list[Any]]:
    """Sort each run of consecutive ``stage.cancelled`` entries by stage: the contract fixes
    which stages are cancelled when a run stops, not the order the driver records them in."""
    out: list[list[Any]] = []
    run: list[list[Any]] = []
    for entry in trace:
        if entry[0] == "stage.cancelled":
            run.append(entry)
            continue
        out.extend(sorted(run, key=lambda e: str(e[1])))
        run = []
        out.append(entry)
    out.extend(sorted(run, key=lambda e: str(e[1])))
    return out


@dataclass
class Expected:
    status: str
    stages: dict[str, str]
    error: list[Any] | None
    compensation_errors: list[list[Any]]
    output: Any
    trace: list[list[Any]]
    counts: dict[str, int]
    compensations: list[str]
    redrive: bool = False  # the runner redrives after the first failure
    redrives: int = 0  # how many times (``Case.refail``: twice, the first redrive fails again)
    cancel: bool = False  # the runner cancels once the cancel stage holds
    held_when_failed: bool = False  # a sibling was suspended when a stage failed for good
    stopped: list[str] = field(default_factory=list)  # stages cancelled when the run stopped
    failed_stage: str | None = None
    # what each ``engine.signal`` call returned, by signal name: [delivered, already_completed]
    # or ``FULL`` (SignalQueueFullError)
    signals: dict[str, list[Any]] = field(default_factory=dict)
    # the ``after`` gates the runner sends, by ``gate_key`` (the stage got past its gate; a
    # stage blocked behind the sibling that ended the run stays suspended on its gate, its
    # signal never sent)
    gates_sent: list[str] = field(default_factory=list)

    def observation(self) -> dict[str, Any]:
        return {
            "signals": self.signals,
            "run": {
                "status": self.status,
                "stages": self.stages,
                "error": self.error,
                "compensation_errors": self.compensation_errors,
            },
            "output": self.output,
            "trace": self.trace,
            "counts": self.counts,
            "compensations": self.compensations,
        }


@dataclass
class _StageRun:
    events: list[list[Any]]
    result: str  # completed | failed | held
    error: str | None = None
    output: Any = None
    emits: list[list[Any]] = field(default_factory=list)


def _wait(
    led: dict[str, Any],
    key: str,
    op: Wait,
    state: Any,
    got: list[Any],
    race: tuple[str, str] | None = None,
) -> tuple[str, Any] | None:
    """The wait journaled as step ``key``. A signal sent before or during the wait completes
    it at once; otherwise the first invocation suspends (on the signal's name, whichever wait
    for it this is), and the replay after the signal (or the timeout) goes on. ``race``: (the
    race wait's key, its outcome) for a race wait and for the timeout wait that follows it."""
    if race is not None:
        rkey, outcome = race
        if op.mode == "race":
            if state is None:
                led[key] = "waiting"
                return "suspend", ("signal", f"signal:{op.name}")
            led[key] = "done"
            got.append(signal_payload(key) if outcome == "took" else None)
            return None
        if outcome == "queued" and state is None:  # the timeout wait after it: taken at once
            led[key] = "done"
            got.append(signal_payload(rkey))
            return None
        if outcome == "late" and state is not None:
            led[key] = "done"
            got.append(signal_payload(rkey))
            return None
    if op.mode in ("before", "during"):
        led[key] = "done"
        got.append(signal_payload(key))
        return None
    if state is None:
        led[key] = "waiting"
        return "suspend", ("signal", f"signal:{op.name}")
    if op.mode == "after":
        led[key] = "done"
        got.append(signal_payload(key))
        return None
    led[key] = "timedout"
    if not op.catch:
        return "fail", ("StepTimeoutError", True)
    got.append(None)
    return None


class _Sim:
    def __init__(self, case: Case, races: dict[str, str] | None = None) -> None:
        self.case = case
        self.races = races or {}
        # after a redrive the runner sends a hold's signal once it suspended on it (in the
        # first run a hold waits for good: it ends by a cancel or a sibling's failure)
        self.release = False
        self.ledger: dict[str, dict[str, Any]] = {s.id: {} for s in case.stages}
        self.step_runs: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.outputs: dict[str, Any] = {}
        self.completed: list[str] = []  # completion order
        self.business: list[list[Any]] = []
        self.status: dict[str, str] = {s.id: "skipped" for s in case.stages}
        self.gates_sent: list[str] = []
        # a bounded case: its early signals queued and not consumed yet (by key)
        self.queued: set[str] = set()

    def late_send(self) -> None:
        """The runner sends a signal to a suspended wait now: refused at the bound."""
        if self.case.bound is not None and len(self.queued) >= self.case.bound:
            raise LateSignalRefused(
                f"a signal sent to a suspended wait meets {len(self.queued)} queued ones"
            )

    def hit(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _invoke(self, s: StageCase, attempt: int, redriven: str | None) -> tuple[str, Any]:
        """One invocation of the body (a replay from the top). Returns (kind, detail):
        suspend -> (reason, waiting_for); fail -> (error type, retryable); done -> output;
        hold."""
        led = self.ledger[s.id]
        got: list[Any] = []
        if s.gate == "timeout":  # never sent: the first wait suspends, then every attempt
            name = s.gate_signal  # fails at once on the journaled timeout, the body never runs
            if led.get(s.gate_signal) is None:
                led[name] = "waiting"
                return "suspend", ("signal", f"signal:{name}")
            led[name] = "timedout"
            return "fail", ("StepTimeoutError", True)
        if s.gate is not None:
            name = s.gate_signal
            if led.get(name) is None and s.gate == "after":
                led[name] = "gated"  # (model only: the gate journals nothing while it waits)
                return "suspend", ("signal", f"signal:{name}")
            if led.get(name) == "gated":
                self.late_send()
                self.gates_sent.append(s.gate_key)
            self.queued.discard(s.gate_key)
            led[name] = "done"  # the body's first wait returns it at once
            got.append(signal_payload(s.gate_key))  # (the one meant for it: see gate_shares)
        self.hit(f"body:{s.id}")
        emits: list[list[Any]] = []
        for op, key in zip(s.ops, wait_keys(s.ops), strict=True):
            if isinstance(op, Emit):
                emits.append(["business", op.type, s.id, {"n": op.n}])
                continue
            ended = self._replay(s, op, key or op.name, got)
            if ended is not None:
                return ended
        outcome = redriven or s.outcome(attempt)
        # (the cancel stage of a late cancel reaches its hold only in an attempt scripted to
        # succeed: one scripted to fail fails first, so it may itself be the stage that fails
        # for good and is redriven, then holds in the redriven run, ``Case.cancel_late``)
        late = s.id == self.case.cancel and self.case.cancel_late and outcome != "ok"
        held = self._hold(s) if s.hold and not late else None
        if held is not None:
            return held
        if outcome == "error":
            return "fail", ("ScriptedError", True)
        if outcome == "fatal":
            return "fail", ("NonRetryableError", False)
        return "done", (stage_output(s, attempt, got), emits)

    def _hold(self, s: StageCase) -> tuple[str, Any] | None:
        """The stage's hold: it waits for good in the first run; after a redrive (``release``)
        its wait suspends (again) and the runner sends its signal."""
        led = self.ledger[s.id]
        state = led.get(s.hold_signal)
        if self.release and s.id == self.case.cancel and self.case.cancel_late:
            # (``Case.cancel_late``: it suspends on its hold again, and the runner cancels)
            led[s.hold_signal] = "waiting"
            return "hold", ("signal", f"signal:{s.hold_signal}")
        if self.release and state != "released" and s.id != self.case.cancel:
            # (its wait journaled in the first run suspends again, then takes the signal,
            # sent to a suspended wait: refused at the bound)
            self.late_send()
            led[s.hold_signal] = "released"
            return "suspend", ("signal", f"signal:{s.hold_signal}")
        if state is None:
            led[s.hold_signal] = "waiting"
            return "hold", ("signal", f"signal:{s.hold_signal}")
        if state != "released":
            raise ModelError("a hold is never signalled")
        return None

    def _replay(
        self, s: StageCase, op: RunStep | Sleep | Wait, key: str, got: list[Any]
    ) -> tuple[str, Any] | None:
        """Replay one durable step, journaled as ``key``, against the stage's ledger,
        appending what it returned to ``got``; the invocation's (kind, detail) when the step
        ends it, else None."""
        led = self.ledger[s.id]
        state = led.get(key)
        if isinstance(op, RunStep):
            counted = f"{s.id}.{op.name}"
            if state != "done":
                self.step_runs[counted] = self.step_runs.get(counted, 0) + 1
                self.hit(f"step:{counted}")
                if self.step_runs[counted] <= op.fails:
                    return "fail", ("FlakyStepError", True)
                led[key] = "done"
            got.append(step_result(s, counted))
            return None
        if isinstance(op, Sleep):
            if state is None:
                led[key] = "sleeping"
                return "suspend", ("sleep", f"sleep:{op.name}")
            led[key] = "done"
            return None
        if op.mode in ("before", "during"):
            self.queued.discard(key)
        elif op.mode == "after" and state is not None:
            self.late_send()
        race = None
        if op.mode in ("race", "timeout"):
            rkey = race_key(s, op.name)
            if rkey is not None:
                race = (rkey, self.races.get(rkey, "took"))
        return _wait(led, key, op, state, got, race)

    def run_stage(self, s: StageCase, redriven: str | None = None) -> _StageRun:
        """``redriven``: the outcome the runner scripts for every attempt of the stage it
        redrove (``ok``, or ``fatal`` on a redrive that fails again, ``Case.refail``)."""
        events: list[list[Any]] = []
        for attempt in range(1, s.max_attempts + 1):
            events.append(["stage.started", s.id, attempt])
            while True:
                kind, detail = self._invoke(s, attempt, redriven)
                if kind == "suspend":
                    events.append(["stage.suspended", s.id, *detail])
                    continue
                break
            if kind == "hold":
                events.append(["stage.suspended", s.id, *detail])
                return _StageRun(events, "held")
            if kind == "done":
                output, emits = detail
                events.append(["stage.completed", s.id, attempt])
                return _StageRun(events, "completed", output=output, emits=emits)
            etype, retryable = detail
            will_retry = retryable and attempt < s.max_attempts
            events.append(["stage.failed", s.id, attempt, etype, will_retry])
            if not will_retry:
                return _StageRun(events, "failed", error=etype)
        raise AssertionError("unreachable")

    def run_groups(
        self,
        groups: list[list[str]],
        trace: list[list[Any]],
        redriven: str | None = None,
        scripted: str = "ok",
    ) -> tuple[str, str | None, str | None, list[str]]:
        """Run groups in order. Returns (end, stage, error, stopped stages) where end is
        completed | failed | cancelled."""
        order = self.case.run_order()
        for group in groups:
            runs: dict[str, _StageRun] = {}
            end: tuple[str, str, str | None] | None = None
            stopped: list[str] = []
            for sid in [x for x in order if x in group]:
                s = self.case.stage(sid)
                if end is not None:  # blocked behind the stage that ended the run
                    events = [["stage.started", sid, 1]]
                    # its gate waited at once, for a signal never sent (unless it journaled the
                    # signal before a redrive: passed at once)
                    if s.gate == "after" and self.ledger[sid].get(s.gate_signal) != "done":
                        events.append(["stage.suspended", sid, "signal", f"signal:{s.gate_signal}"])
                    runs[sid] = _StageRun(events, "blocked")
                    stopped.append(sid)
                    continue
                r = self.run_stage(s, redriven=scripted if sid == redriven else None)
                runs[sid] = r
                if r.result == "completed":
                    self.status[sid] = "completed"
                    self.outputs[sid] = r.output
                    self.completed.append(sid)
                    self.business.extend(r.emits)
                elif r.result == "failed":
                    self.status[sid] = "failed"
                    end = ("failed", sid, r.error)
                elif sid == self.case.cancel and (self.release or not self.case.cancel_late):
                    end = ("cancelled", sid, None)
                    stopped.append(sid)
                else:
                    stopped.append(sid)
            for sid in sorted(runs):
                trace.extend(runs[sid].events)
            if end is not None:
                return end[0], end[1], end[2], stopped
            if stopped:
                raise ModelError(f"stages {stopped} wait for a signal nobody sends")
        return "completed", None, None, []

    def stop(self, stopped: list[str], trace: list[list[Any]]) -> list[list[Any]]:
        """Cancel the stopped stages and compensate completed ones newest first."""
        comp_errors: list[list[Any]] = []
        for sid in sorted(stopped):
            self.status[sid] = "cancelled"
            trace.append(["stage.cancelled", sid])
        for sid in reversed(self.completed):
            s = self.case.stage(sid)
            if s.compensation is None:
                continue
            if s.compensation == "ok":
                self.hit(f"comp:{sid}")
                self.status[sid] = "compensated"
                trace.append(["stage.compensated", sid])
            else:
                self.hit(f"comp:{sid}", s.max_attempts)
                comp_errors.append(["UndoError", sid])
        return comp_errors


def race_key(s: StageCase, name: str) -> str | None:
    """The step key of the stage's race wait for ``name`` (``Wait.mode == "race"``), if any:
    a race wait's name is its own and the one timeout wait after it (``Wait``) shares it."""
    for op, key in zip(s.ops, wait_keys(s.ops), strict=True):
        if isinstance(op, Wait) and op.mode == "race" and op.name == name:
            return key
    return None


def _comp_order(sim: _Sim) -> list[str]:
    out: list[str] = []
    for sid in reversed(sim.completed):
        s = sim.case.stage(sid)
        if s.compensation == "ok":
            out.append(f"comp:{sid}")
        elif s.compensation == "fail":
            out.extend([f"comp:{sid}"] * s.max_attempts)
    return out


def expect(
    case: Case, refused: set[str] | None = None, races: dict[str, str] | None = None
) -> Expected:
    """What every driver must observe for ``case`` (a bounded one: see ``bounded_plan``;
    ``refused``: the early signals the engine refused, default: those the contract says;
    ``races``: what became of each race wait's signal, by its key, default ``took``)."""
    if case.bound is None:
        exp = _expect(case, set(), races)
        exp.signals = signal_answers(case, exp.trace, exp.gates_sent)
        return exp
    runs, early, queued = bounded_plan(case, refused)
    exp = _expect(runs, queued)
    answers = signal_answers(runs, exp.trace, exp.gates_sent)
    for name, got in early.items():
        answers[name] = got + (answers.get(name, []) if FULL in got else [])
    exp.signals = dict(sorted(answers.items()))
    return exp


def signal_answers(
    case: Case, trace: list[list[Any]], gates_sent: Sequence[str] = ()
) -> dict[str, list[Any]]:
    """What ``engine.signal`` answers ([delivered, already_completed]) for the signals the
    runner sends with a result fixed by the contract (DESIGN §5): a ``before`` signal, sent
    before any stage of its later group can run, is buffered, and its repeat with the same
    idempotency key is not queued again (``already_completed``); an ``after`` signal, sent
    once its stage is suspended on the wait (only if the trace has that suspension: for the
    k-th wait for a name of a stage that waits for it again, see ``Wait``, the stage's k-th
    suspension on the name; answered in that order), is delivered. A gate's signal
    (``StageCase.gate``) is answered as a wait's of its mode, an ``after`` one only when it is
    sent (``gates_sent``). (``during`` signals race with the
    body: not compared.) The answers to one name are in the order the runner sends them:
    the ``before`` ones (sent at start, see ``Wait`` and ``StageCase.gate_shares``), then the
    ``after`` ones (stages are listed in group order; a stage's waits in body order)."""
    suspended: dict[tuple[str, str], int] = {}  # by (stage, waiting_for)
    for e in trace:
        if e[0] == "stage.suspended":
            suspended[e[1], e[3]] = suspended.get((e[1], e[3]), 0) + 1
    early: dict[str, list[list[bool]]] = {}
    late: dict[str, list[list[bool]]] = {}
    repeat = [[False, False], [False, True]] if repeats_before_signals(case) else [[False, False]]
    for s in case.stages:
        if s.gate == "before":
            early.setdefault(s.gate_signal, []).extend(repeat)
        elif s.gate == "after" and s.gate_key in gates_sent:
            late.setdefault(s.gate_signal, []).append([True, False])
        waits: dict[str, int] = {}  # the late waits for each name so far (the early don't suspend)
        for op in s.ops:
            if not isinstance(op, Wait):
                continue
            if op.mode == "before":
                early.setdefault(op.name, []).extend(repeat)
            if op.mode not in ("after", "timeout"):
                continue
            k = waits[op.name] = waits.get(op.name, 0) + 1
            if op.mode == "after" and suspended.get((s.id, f"signal:{op.name}"), 0) >= k:
                late.setdefault(op.name, []).append([True, False])
    answers: dict[str, list[Any]] = {n: early.get(n, []) + late.get(n, []) for n in {*early, *late}}
    return dict(sorted(answers.items()))


def repeats_before_signals(case: Case) -> bool:
    """Whether the runner repeats each ``before`` signal (same idempotency key): not when a
    stage of the first group is ``local=True``. Such a stage waits at its barrier for the
    ``before`` signals inside the run's first workflow task on Temporal, so no worker can
    answer a signal until it returns: ``signal()`` reports from the run's last state after
    ``signal_timeout``, which cannot tell a repeat (the run still drops it)."""
    first = groups_of(case)[0]
    return not any(case.stage(sid).local for sid in first)


def _expect(case: Case, queued: set[str], races: dict[str, str] | None = None) -> Expected:
    groups = groups_of(case)
    sinks = sorted(s.id for s in case.stages if not any(s.id in o.after for o in case.stages))
    sim = _Sim(case, races)
    sim.queued = set(queued)
    trace: list[list[Any]] = [["run.created"], ["run.started"]]
    end, where, error, stopped = sim.run_groups(groups, trace)
    held_when_failed = end == "failed" and any(
        case.stage(x).hold and sim.ledger[x].get(case.stage(x).hold_signal) for x in stopped
    )
    if end == "failed" and case.redrive and error in _REDRIVEN_ERRORS:
        assert where is not None
        redriven = _expect_redriven(sim, trace, groups, sinks, error, where, stopped)
        if redriven is not None:
            return redriven
    comps = _comp_order(sim) if end != "completed" else []
    if end == "completed":
        trace.extend(sim.business)
        trace.append(["run.completed"])
        comp_errors: list[list[Any]] = []
    else:
        comp_errors = sim.stop(stopped, trace)
        if end == "failed":
            trace.append(["run.failed", error, None])
        else:
            # a failing compensation does not make a cancelled run failed: it stays cancelled
            # (what the user asked for, the cause, as a failed run keeps its stage's error)
            # with the compensation's error recorded and its stage left ``completed``
            trace.append(["run.cancelled"])
    return Expected(
        status=end,
        stages=dict(sorted(sim.status.items())),
        error=[error, where] if end == "failed" else None,
        compensation_errors=comp_errors,
        output=_run_output(sinks, sim.outputs) if end == "completed" else None,
        trace=trace,
        counts=dict(sorted(sim.counts.items())),
        compensations=comps,
        redrive=False,  # a redrive that completes the run is expected above
        cancel=end == "cancelled",
        held_when_failed=held_when_failed,
        stopped=sorted(stopped),
        failed_stage=where if end == "failed" else None,
        gates_sent=sim.gates_sent,
    )


_REDRIVEN_ERRORS = ("ScriptedError", "NonRetryableError")


def _expect_redriven(
    sim: _Sim,
    trace: list[list[Any]],
    groups: list[list[str]],
    sinks: list[str],
    error: str,
    where: str,
    stopped: list[str],
) -> Expected | None:
    """The runner redrives a run that failed at ``where`` from its last failure: what every
    driver observes when the redriven attempt and the groups after it complete, or when a
    later stage fails for good (no sibling held), else None (the case is then expected to end
    failed, without a redrive). A redrive re-runs the failed stage and the siblings its
    failure cancelled (``stopped``; each from attempt 1, its journal kept), keeps the
    completed ones, then runs the groups after it. ``Case.refail``: the first redrive's
    attempts of ``where`` fail for good (NonRetryableError) again, the run compensates and
    fails again, and a second redrive completes it. After a redrive the runner sends each
    hold's signal once the stage suspended on it (``_Sim.release``)."""
    case = sim.case
    trial = copy.deepcopy(sim)
    trial.release = True
    t_trace = copy.deepcopy(trace)
    comps: list[str] = []
    rounds = 2 if case.refail else 1
    f_where, f_error, f_stopped = where, error, stopped
    for k in range(rounds):
        comps += _comp_order(trial)
        trial.stop(f_stopped, t_trace)
        t_trace.append(["run.failed", f_error, None])
        t_trace.append(["run.redriven", "last_failure"])
        trial.business = []
        for sid, st in trial.status.items():
            if st == "compensated":
                trial.status[sid] = "completed"
        gi = next(i for i, g in enumerate(groups) if f_where in g)
        again = [x for x in groups[gi] if x == f_where or x in f_stopped]
        rest = [again, *groups[gi + 1 :]]
        scripted = "fatal" if k < rounds - 1 else "ok"
        try:
            t_end, t_where, t_error, t_stopped = trial.run_groups(
                rest, t_trace, redriven=where, scripted=scripted
            )
        except LateSignalRefused:
            raise  # (the runner would meet it: ``make_valid`` raises the bound)
        except ModelError:
            return None
        if k < rounds - 1:
            if t_end != "failed" or t_where != where:
                return None  # (unreachable: ``where`` fails at once)
            assert t_where is not None and t_error is not None
            f_where, f_error, f_stopped = t_where, t_error, t_stopped
    if t_end == "failed" and not t_stopped:
        # a later stage fails for good: the run compensates its completed stages again, the
        # kept ones too, each compensation running anew
        comps += _comp_order(trial)
        comp_errors = trial.stop([], t_trace)
        t_trace.append(["run.failed", t_error, None])
        return Expected(
            status="failed",
            stages=dict(sorted(trial.status.items())),
            error=[t_error, t_where],
            compensation_errors=comp_errors,
            output=None,
            trace=t_trace,
            counts=dict(sorted(trial.counts.items())),
            compensations=comps,
            redrive=True,
            redrives=rounds,
            failed_stage=where,
            gates_sent=trial.gates_sent,
        )
    if t_end == "cancelled" and case.cancel_late:
        # the redriven run is cancelled: it compensates its completed stages again, the kept
        # ones too, and ends cancelled (a failing compensation recorded, DESIGN §5 "Cancel")
        comps += _comp_order(trial)
        comp_errors = trial.stop(t_stopped, t_trace)
        t_trace.append(["run.cancelled"])
        return Expected(
            status="cancelled",
            stages=dict(sorted(trial.status.items())),
            error=None,
            compensation_errors=comp_errors,
            output=None,
            trace=t_trace,
            counts=dict(sorted(trial.counts.items())),
            compensations=comps,
            redrive=True,
            redrives=rounds,
            cancel=True,
            stopped=sorted(t_stopped),
            failed_stage=where,
            gates_sent=trial.gates_sent,
        )
    if t_end != "completed":
        return None
    t_trace.extend(trial.business)
    t_trace.append(["run.completed"])
    return Expected(
        status="completed",
        stages=dict(sorted(trial.status.items())),
        error=None,
        compensation_errors=[],
        output=_run_output(sinks, trial.outputs),
        trace=t_trace,
        counts=dict(sorted(trial.counts.items())),
        compensations=comps,
        redrive=True,
        redrives=rounds,
        failed_stage=where,  # the stage redriven (its next attempt succeeds)
        gates_sent=trial.gates_sent,
    )


def _run_output(sinks: list[str], outputs: dict[str, Any]) -> Any:
    if len(sinks) == 1:
        return outputs.get(sinks[0])
    return {s: outputs.get(s) for s in sinks}
