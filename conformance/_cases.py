"""Generated cases for the differential fuzzer: the ``Case`` value and hypothesis strategies.

A case is a DAG of stages, each with a script: durable steps, sleeps, signal waits, emitted
business events, then an outcome per attempt; plus outside actions (cancel when a stage is
suspended on a signal nobody sends, redrive after a failure). Every case is deterministic on
every driver: the stages of one parallel group run their scripts one after the other in
``Case.order`` (each body first waits, in the test process, until every sibling has started, a
sibling gated ``after`` a signal is suspended on it, and its predecessor in that order is
settled: completed, or suspended on a signal never sent), so
completion order, compensation order and what a failure or a cancel finds are all fixed.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = [
    "KNOWN_GAPS",
    "REGRESSIONS",
    "Case",
    "Emit",
    "Op",
    "RunStep",
    "Sleep",
    "StageCase",
    "Wait",
    "bounded",
    "cases",
    "fixed_draws",
    "groups_of",
    "regression_batch",
    "wait_keys",
]

# Behaviours DESIGN §5 specifies that a driver does not implement yet (fixes under way). While a
# name is in this set the generator never draws a case that hits it, so CI can be green; remove
# a name once its fix lands (``WFE_FUZZ_GAPS=none`` draws everything). None is open now;
# closed: ``signal_during_stage``, ``failure_stops_siblings``, ``signal_holder`` (see
# conformance/README.md "Known gaps").
KNOWN_GAPS: frozenset[str] = frozenset()

Outcome = Literal["ok", "error", "fatal"]  # return / raise ScriptedError / NonRetryableError


@dataclass(frozen=True)
class RunStep:
    """``ctx.step.run(name, fn)``; the body raises FlakyStepError on its first ``fails`` runs."""

    name: str
    fails: int = 0


@dataclass(frozen=True)
class Sleep:
    name: str
    ms: int = 50


@dataclass(frozen=True)
class Wait:
    """``ctx.step.wait_for_signal(name)``. mode ``after``: the test sends the signal once the
    stage's ``stage.suspended`` reached the sink; ``before``: the test sends it right after
    start, before the stage starts (stages of the first group wait for it; only in later
    groups), so it is buffered and consumed without a suspension; ``during``: sent right after
    start while the stage may already run, its body waits for it before reaching the wait;
    ``timeout``: no signal, ``timeout=ms``, StepTimeoutError caught (``catch``) or not. The
    wait re-reads the clock after journaling its deadline, so a timeout shorter than a busy
    machine's database round trip times out without suspending: keep ``ms`` >= 400.

    ``name`` is the signal's. A later wait of the stage may repeat the name of an earlier one
    (an approval loop): the engine journals the k-th wait for a name as the step ``name#k``
    from k=2 (``wait_keys``), and every signal's payload names the step key of the wait it is
    meant for (``signal_payload``), so a wait given another wait's signal shows. Signals of
    one name queue in arrival order and each wait takes the oldest (DESIGN §5), so the waits
    of a repeated name are its *early* ones (``before``, ``during``) first, then its *late*
    ones (``after``, ``timeout``): the test sends the early signals right after start in the
    order of their waits (all of them before the stage reaches its first wait for the name, or
    at least each before its own wait), so the k-th early wait takes the k-th, none is left
    when the late waits come, and it sends one signal per ``after`` wait once the stage's j-th
    suspension on the name reached the sink, j its rank among the late waits of the name (the
    early ones do not suspend). An early wait after a late one of its name is never drawn:
    its signal, sent at start, would go to the late wait, and a timeout racing a signal is
    not deterministic, except in a ``race`` wait: ``timeout=ms``, caught, its signal sent
    ``lag`` ms after its suspension reached the sink, about when the timeout falls (which
    comes first is up to timing), then a ``timeout`` wait for its name, the name's only other
    wait in the run: the race wait takes the signal, or the timeout wait does, or it stays
    queued (``conformance._model.RACE_OUTCOMES``); it is never lost."""

    name: str
    mode: Literal["after", "before", "during", "timeout", "race"] = "after"
    ms: int = 100
    catch: bool = False
    lag: int = 0  # (``race``) ms after its suspension reached the sink that its signal goes


@dataclass(frozen=True)
class Emit:
    type: str
    n: int = 0
    in_step: bool = False  # staged by a step's function (journaled with it, replayed)


Op = RunStep | Sleep | Wait | Emit


@dataclass(frozen=True)
class StageCase:
    id: str
    after: tuple[str, ...] = ()
    max_attempts: int = 1
    interval_ms: int = 20
    ops: tuple[Op, ...] = ()
    outcomes: tuple[Outcome, ...] = ("ok",)  # per attempt; past the end: "ok"
    compensation: Literal["ok", "fail"] | None = None
    # end the script with a wait for a signal nobody sends, before the attempt's outcome
    # (the cancel stage of a ``Case.cancel_late``: after it, in an attempt scripted to succeed)
    hold: bool = False
    # JSON text of a value the stage's step results and its output carry (big and negative
    # integers, extreme floats, -0.0, any unicode, nesting): it must come back as given
    value: str | None = None
    # a ``local=True`` stage (drawn only for a stage alone in its group; consecutive ones run
    # as one local activity). Its waits are ``after`` and ``timeout`` ones only: a local stage
    # runs inside its run's workflow task on Temporal, where a signal sent meanwhile only
    # arrives after it
    local: bool = False
    # ``@wf.stage(after_signal=gate_signal)``: the stage waits for that signal before its body
    # runs (the body then begins with ``wait_for_signal(gate_signal)``, which returns it at
    # once). ``after``: the test sends it once the stage's ``stage.suspended`` on it reached
    # the sink and its predecessor in ``Case.order`` settled (where its body's barrier would
    # let it go on: a gate is passed before the barrier, so a stage blocked behind a sibling
    # that ended the run stays suspended on it and ends cancelled); ``before``: sent right
    # after start, buffered, passed without a suspension (only in later groups, as a
    # ``Wait``); ``timeout``: never sent, ``after_signal_timeout`` of 400 ms, so every attempt
    # fails with StepTimeoutError and the body never runs (only on a stage alone in its group:
    # the deadline is not ordered with siblings). Never on a ``local`` stage.
    gate: Literal["after", "before", "timeout"] | None = None
    # an ``after`` or ``before`` gate may wait for the signal name of the gate of a stage in an
    # EARLIER group (its id here): gates sharing a name take its signals oldest first (DESIGN
    # §5), and the earlier group's gate is always the earlier wait, so each takes the signal
    # meant for it (the payload names the stage, ``gate_key``). Its ``before`` gates come
    # before its ``after`` ones in group order (a ``before`` signal, sent at start, would
    # go to an earlier ``after`` gate). Never two gates of one name in one group: both may be
    # suspended on it when one signal comes, and the contract does not say which one takes
    # it. Never with a ``timeout`` gate.
    gate_shares: str | None = None

    def outcome(self, attempt: int) -> Outcome:
        return self.outcomes[attempt - 1] if attempt <= len(self.outcomes) else "ok"

    @property
    def hold_signal(self) -> str:
        return f"hold_{self.id}"

    @property
    def gate_signal(self) -> str:
        return f"gate_{self.gate_shares or self.id}"

    @property
    def gate_key(self) -> str:
        """What the signal meant for this stage's gate carries (``signal_payload``) and its
        idempotency key: ``gate_<id>`` (the signal name too unless ``gate_shares``)."""
        return f"gate_{self.id}"


@dataclass(frozen=True)
class Case:
    stages: tuple[StageCase, ...]
    order: tuple[str, ...] = ()  # run order inside each parallel group; default: by id
    cancel: str | None = None  # cancel once this (holding) stage is suspended on its hold
    redrive: bool = False  # after a failure: redrive from last_failure, next attempt succeeds
    # (with ``redrive``) the first redrive's attempts of the redriven stage fail for good
    # (NonRetryableError) again; the runner redrives a second time, and that one succeeds
    refail: bool = False
    # ``max_pending_signals`` of the engine that starts and signals the run (None: the
    # default, never reached). A bounded case (``bounded``) has no ``local`` stage, no wait
    # for a name another wait of the run uses and no shared gate, and its first group's
    # bodies wait until every early signal was sent: the early signals, sent at start one
    # after the other, meet a queue nothing takes from yet, so which of them the run refuses
    # (SignalQueueFullError) is fixed; a wait whose signal was refused suspends and the
    # runner sends it again once it did (``conformance._model.bounded_plan``)
    bound: int | None = None
    # (with ``cancel`` and ``redrive``) cancel after the redrive instead: a stage fails for
    # good in the first run, either a sibling after the cancel stage in ``order`` (the cancel
    # stage holds like any hold there, settled; the redrive re-runs both, and once the cancel
    # stage suspended on its hold again the runner cancels the run; never with ``refail``), or
    # a stage that runs before the cancel stage (an earlier group's, or a sibling before it:
    # the cancel stage never holds in the first run; the redrive runs the failed stage, then
    # the cancel stage, and once it holds the runner cancels; with ``refail`` only after the
    # second redrive), or the cancel stage itself: a late cancel's stage reaches its hold
    # only in an attempt scripted to succeed (one scripted to fail fails before it), so it
    # fails for good in the first run without holding, the redrive runs it again (its
    # attempts scripted to succeed) and once it holds the runner cancels (with ``refail``:
    # the first redrive fails it again at once, before its hold, the second one holds)
    cancel_late: bool = False
    label: str = field(default="", compare=False)

    def stage(self, sid: str) -> StageCase:
        return next(s for s in self.stages if s.id == sid)

    def run_order(self) -> tuple[str, ...]:
        return self.order or tuple(sorted(s.id for s in self.stages))

    def to_python(self) -> str:
        """Ready-to-paste code that rebuilds this case."""
        lines = ["Case(", "    stages=("]
        for s in self.stages:
            lines.append(f"        {s!r},")
        lines.append("    ),")
        if self.order:
            lines.append(f"    order={self.order!r},")
        if self.cancel is not None:
            lines.append(f"    cancel={self.cancel!r},")
        if self.redrive:
            lines.append("    redrive=True,")
        if self.refail:
            lines.append("    refail=True,")
        if self.cancel_late:
            lines.append("    cancel_late=True,")
        if self.bound is not None:
            lines.append(f"    bound={self.bound!r},")
        lines.append(")")
        return "\n".join(lines)


def wait_keys(ops: Sequence[Op]) -> list[str | None]:
    """The step key each op that is a ``Wait`` is journaled under (None for other ops): its
    name for the first wait for that name in the stage, ``name#k`` for the k-th (as
    ``ctx.step.wait_for_signal`` keys them)."""
    seen: dict[str, int] = {}
    out: list[str | None] = []
    for op in ops:
        if not isinstance(op, Wait):
            out.append(None)
            continue
        k = seen[op.name] = seen.get(op.name, 0) + 1
        out.append(op.name if k == 1 else f"{op.name}#{k}")
    return out


def groups_of(case: Case) -> list[list[str]]:
    """Topological layers (as ``Workflow.graph().groups``): ids sorted within a layer."""
    level: dict[str, int] = {}
    remaining = {s.id: s for s in case.stages}
    while remaining:
        ready = [s for s in remaining.values() if all(d in level for d in s.after)]
        if not ready:
            raise ValueError("cycle")
        for s in ready:
            level[s.id] = 1 + max((level[d] for d in s.after), default=-1)
            del remaining[s.id]
    out: list[list[str]] = [[] for _ in range(max(level.values()) + 1)]
    for sid, lv in level.items():
        out[lv].append(sid)
    return [sorted(g) for g in out]


# -- strategies ---------------------------------------------------------------------------------


HARD_NUMBERS = (10**30, 2**64 + 1, -(2**63) - 1, -0.0, 0.1, 1.5e300, 5e-324)


def json_values() -> Any:
    """A hypothesis strategy of JSON values every backend must return as given: integers far
    past 64 bits, extreme and tiny floats, -0.0, text in any script (no NUL or lone surrogate:
    the port refuses those), nested lists and objects."""
    from hypothesis import strategies as st

    text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6)
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-(2**80), 2**80)
        | st.sampled_from(HARD_NUMBERS)
        | st.floats(allow_nan=False, allow_infinity=False)
        | text
    )
    nested = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=5,
    )
    # bare values half the time: a bare number is what some backends store apart (SQLite's
    # numeric affinity turned 10**30 into 1e+30), and the known hard cases come up often
    return st.one_of(st.sampled_from(HARD_NUMBERS), scalars, nested)


@functools.cache
def _sampled_of(key: tuple[tuple[type, Any], ...]) -> Any:
    from hypothesis import strategies as st

    return st.sampled_from(tuple(v for _, v in key))


def _sampled(options: Sequence[Any]) -> Any:
    """``st.sampled_from(options)``, one strategy object per distinct ``options``: hypothesis
    checks a strategy the first time it draws from it (``validate``, ``is_empty``), which was
    a third of the generator's time when each draw built a new one; the draws are the same.
    (Keyed with each value's type: ``(0, 1) == (False, True)``.)"""
    return _sampled_of(tuple((type(v), v) for v in options))


def _pick(draw: Any, options: Sequence[Any]) -> Any:
    """One of ``options``, drawn (``_sampled``)."""
    return draw(_sampled(options))


def _layers(sizes: list[int]) -> list[list[str]]:
    """Stage ids by layer for layers of the drawn ``sizes``, at most 12 stages in all."""
    total = 0
    trimmed = []
    for drawn in sizes:
        size = min(drawn, 12 - total)
        if size <= 0:
            break
        trimmed.append(size)
        total += size
    letters = iter("abcdefghijkl")
    return [[next(letters) for _ in range(size)] for size in trimmed]


def cases(gaps: frozenset[str] = KNOWN_GAPS) -> Any:
    """A hypothesis strategy of deterministic cases (1-12 stages, groups of up to 4)."""
    from hypothesis import strategies as st

    value_json = st.none() | json_values().map(json.dumps)

    @functools.cache  # (one strategy per arguments, as ``_sampled``)
    @st.composite
    def _ops(draw: Any, sid: str, root: bool, local: bool) -> tuple[Op, ...]:
        n = draw(st.integers(0, 4))
        ops: list[Op] = []
        for i in range(n):
            kind = _kind(draw, local)
            name = f"{sid}{i}"
            if kind == "run":
                ops.append(RunStep(name, fails=_pick(draw, [0, 0, 0, 1, 2])))
            elif kind == "sleep":
                ops.append(Sleep(name, ms=_pick(draw, [20, 50, 200])))
            elif kind == "race":
                ops.extend(_race(draw, name))
            elif kind == "emit":
                ops.append(
                    Emit(f"{sid}.e{i}", n=draw(st.integers(0, 9)), in_step=draw(st.booleans()))
                )
            else:
                modes = ["after", "after", "timeout"]
                # (a local stage waits only for a signal sent once its suspension is known, or
                # for none: one sent while it runs reaches its run only after it on Temporal)
                modes += [] if root or local else ["before"]
                modes += [] if "signal_during_stage" in gaps or local else ["during"]
                ops.extend(_waits(draw, ops, name, modes, local))
        return tuple(ops)

    @functools.cache
    @st.composite
    def _stage(draw: Any, sid: str, after: tuple[str, ...], root: bool, alone: bool) -> StageCase:
        max_attempts = draw(st.integers(1, 3))
        local = alone and draw(st.booleans())
        ops = draw(_ops(sid, root, local))
        # a gate on one stage in six of the first group (``after``), two in seven of a later
        # one (``after`` or ``before``); a stage alone in its group may also time out on it
        gates: list[str | None] = [None] * 5 + ["after"] + ([] if root else ["before"])
        gates += ["timeout"] if alone else []
        gate = None if local else _pick(draw, gates)
        return StageCase(
            id=sid,
            after=after,
            max_attempts=max_attempts,
            interval_ms=_pick(draw, [20, 50]),
            ops=ops,
            outcomes=tuple(
                _pick(draw, ["ok", "ok", "ok", "ok", "error", "error", "fatal"])
                for _ in range(max_attempts)
            ),
            compensation=_pick(draw, [None, None, "ok", "ok", "fail"]),
            # (a stage that times out on its gate never reaches a hold)
            hold=not local and gate != "timeout" and _pick(draw, [False, False, False, True]),
            value=draw(value_json),
            local=local,
            gate=gate,
        )

    @st.composite
    def _case(draw: Any) -> Case:
        n_groups = draw(st.integers(1, 5))
        layers = _layers([_pick(draw, [1, 1, 1, 2, 3, 4]) for _ in range(n_groups)])
        stages: list[StageCase] = []
        for k, layer in enumerate(layers):
            for sid in layer:
                after: tuple[str, ...] = ()
                if k > 0:
                    first = _pick(draw, layers[k - 1])
                    earlier = [x for lay in layers[:k] for x in lay if x != first]
                    extra = draw(st.lists(_sampled(earlier), max_size=2)) if earlier else []
                    after = tuple(sorted({first, *extra}))
                stages.append(draw(_stage(sid, after, k == 0, len(layer) == 1)))
        order = tuple(x for layer in layers for x in draw(st.permutations(layer)))
        holders = [s.id for s in stages if s.hold]
        cancel = _pick(draw, [None, None, *holders]) if holders else None
        case = Case(
            stages=tuple(_share_gates(draw, stages, layers)),
            order=order,
            cancel=cancel,
            redrive=draw(st.booleans()),
        )
        case = _outside(draw, case)
        # two cases in five bound the run's queue, small enough to refuse early signals
        bound = _pick(draw, [None, None, None, 1, 2])
        if bound is not None:
            # (and most of its waits early, so that the bound is met: a case refuses an
            # early signal only when more were sent than it holds)
            first = set(layers[0])
            modes = {True: ["after", "during", "during"], False: ["after", "before", "during"]}
            stages = [
                replace(
                    s,
                    ops=tuple(
                        replace(op, mode=_pick(draw, modes[s.id in first]))
                        if isinstance(op, Wait) and op.mode == "after"
                        else op
                        for op in s.ops
                    ),
                )
                for s in case.stages
            ]
            case = bounded(replace(case, stages=tuple(stages)), bound)
        return make_valid(case, gaps)

    return _case()


@contextlib.contextmanager
def fixed_draws() -> Iterator[None]:
    """Inside it, a derandomized hypothesis test draws the same cases in every process.

    ``derandomize=True`` fixes the seed, but not what hypothesis draws with it: now and then it
    draws a constant of the code under test instead of a random value (hypothesis >= 6.131),
    from a pool it gathers from every module of this project imported so far (not test
    files), so the cases a test drew depended on which tests ran before it in its process
    (which imported which drivers): a corner some test counts came out drawn in one process
    and never in another. Inside this block the pool is empty (hypothesis's own constants
    stay), and the cases follow from the seed alone."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - (a hypothesis without it has no pool)
        yield
        return
    gather = getattr(providers, "_get_local_constants", None)
    if gather is None:
        if hasattr(providers, "_local_constants"):
            # (its pool is still there but gathered elsewhere: pin that instead)
            raise RuntimeError("fixed_draws() does not know this hypothesis version's pool")
        yield  # (an older hypothesis: no pool)
        return
    from hypothesis.internal.constants_ast import Constants

    empty = Constants()
    # (the allowed constants are cached per kind of draw, the pool's among them: cleared on
    # the way in and out, so that none of the pool leaks in and none of the empty one out)
    providers.CONSTANTS_CACHE.cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = gather
        providers.CONSTANTS_CACHE.cache.clear()


def _waits(draw: Any, ops: Sequence[Op], name: str, modes: list[str], local: bool) -> list[Op]:
    """A drawn wait of one of ``modes``, named ``name`` unless it waits again for the name of
    an earlier wait of the stage (``ops``); an early one (``before``, ``during``) followed, one
    time in three, by a second early wait for its name (two early waits for one name are what
    the FIFO queue orders, and few stages would draw them otherwise)."""
    from hypothesis import strategies as st

    mode = _pick(draw, modes)
    # a wait may wait again for the signal of an earlier wait of the stage (an approval loop:
    # steps ``name#2``, ...): half the time, three times in four in an early wait or a local
    # stage, whose every try re-reads what the tries before it journaled (counting a step's
    # records twice there once handed the first wait the second wait's signal on Temporal).
    # A late wait (``after``, ``timeout``) any earlier wait's name; an early one (``before``,
    # ``during``) only a name no late wait used yet (see ``Wait``)
    again = _names_again(ops, mode)
    often = local or mode in ("before", "during")
    repeat = _sampled((True, True, True, False)) if often else st.booleans()
    if again and draw(repeat):
        name = _pick(draw, again)
    if mode == "timeout":
        ms = _pick(draw, [400, 600])
        return [Wait(name, "timeout", ms, draw(st.booleans()))]
    out: list[Op] = [Wait(name, mode)]
    early = [m for m in modes if m in ("before", "during")]
    if mode in early and _pick(draw, [False, False, True]):
        out.append(Wait(name, _pick(draw, early)))
    return out


def _kind(draw: Any, local: bool) -> str:
    """The kind of a stage's next op: run, sleep, wait, emit or race."""
    from hypothesis import strategies as st

    # (a local stage waits more often: its waits for one name again are what its tries'
    # journal reads get wrong most easily, see ``_waits``)
    kinds = ["run", "run", "sleep", "wait", "emit"] + (["wait", "wait"] if local else [])
    kind: str = _pick(draw, kinds)
    # one run in seven races instead (not in a local stage: it runs inside its workflow task
    # on Temporal, where no signal reaches it while it runs, so nothing races its timeout)
    if kind == "run" and not local and draw(st.integers(0, 6)) == 0:
        kind = "race"
    return kind


def _race(draw: Any, name: str) -> list[Op]:
    """A ``race`` wait (``Wait``) of ``name`` and the timeout wait after it."""

    lag = _pick(draw, [250, 400, 550])
    return [
        Wait(name, "race", ms=400, catch=True, lag=lag),
        Wait(name, "timeout", ms=400, catch=True),
    ]


def _outside(draw: Any, case: Case) -> Case:
    """Half the cancelled cases get a compensation that fails (the run stays ``cancelled``,
    the error recorded: the stage draws alone give few), the redriven cancelled ones a
    cancel after the redrive (``Case.cancel_late``), half the other redriven ones a redrive
    that fails again (``Case.refail``)."""
    from hypothesis import strategies as st

    groups = groups_of(case)
    held = next((k for k, g in enumerate(groups) if case.cancel in g), 0)
    done = [sid for g in groups[:held] for sid in g]  # (they complete before the cancel)
    if done and draw(st.booleans()):
        failing = _pick(draw, done)
        case = replace(
            case,
            stages=tuple(
                replace(s, compensation="fail") if s.id == failing else s for s in case.stages
            ),
        )
    # a redriven cancelled one cancels after the redrive (``Case.cancel_late``): a stage
    # fails for good in the first run, a sibling after the cancel stage in its group (the
    # cancel stage held in the first run too) or a stage that runs before it or the cancel
    # stage itself (it holds only in the redriven run; then half the time after a redrive
    # that fails again, ``Case.refail``), see ``_fail_for_a_late_cancel``
    late = case.cancel is not None and case.redrive
    refail = False
    if late:
        assert case.cancel is not None
        case, first_hold = _fail_for_a_late_cancel(draw, case, groups, held)
        refail = not first_hold and draw(st.booleans())
    else:
        refail = case.redrive and draw(st.booleans())
    return replace(case, refail=refail, cancel_late=late)


def _fail_for_a_late_cancel(
    draw: Any, case: Case, groups: list[list[str]], held: int
) -> tuple[Case, bool]:
    """``case`` (a cancel and a redrive) with a stage that fails for good in the first run,
    every stage that runs before the cancel stage in the run that cancels completing, and
    whether the cancel stage holds in the first run too (the failing stage is a sibling
    after it in its group) rather than only in the redriven run (the failing one runs before
    it: in an earlier group, or before it in its group; or it is the cancel stage itself,
    which fails before its hold in the first run and holds once redriven)."""
    from hypothesis import strategies as st

    assert case.cancel is not None
    group = [x for x in case.run_order() if x in groups[held]]
    at = group.index(case.cancel)
    after, before = group[at + 1 :], [*(x for g in groups[:held] for x in g), *group[:at]]
    # (one of the kinds that fit, drawn alike; with a stage before it, none forced one time
    # in two or three: a case that redrives, maybe twice, then cancels costs two or three
    # runs, and CI's fuzz time should not grow much). One time in three a kind that forces
    # a failure, or a cancel stage alone in the first group, gives way to the cancel stage
    # failing itself (``itself``): a few cases in 100
    kinds = (["first"] if after else []) + (["redriven", "none"] if before else [])
    kind = _pick(draw, kinds) if kinds else "alone"
    if kind != "none" and _pick(draw, [False, False, True]):
        kind = "itself"
    if kind in ("none", "alone"):
        return case, True  # (nothing fails before the cancel: ``make_valid`` cancels at once)
    first_hold = kind == "first"
    failing = case.cancel if kind == "itself" else _pick(draw, after if first_hold else before)
    # every stage that runs before the failing one completes (no other failure first), and
    # every one that runs before the cancel stage in the redriven run; a hold in a group
    # before the failing one's would wait for good in the first run (nothing there fails)
    at_fail = next(k for k, g in enumerate(groups) if failing in g)
    blocked = {x for g in groups[:at_fail] for x in g}
    runs_first = group[: group.index(failing)] if first_hold else [*before, case.cancel]
    tamed = blocked | set(runs_first)

    def fit(s: StageCase) -> StageCase:
        if s.id == failing:
            # (the cancel stage failing itself keeps its hold: an attempt scripted to fail
            # fails before it, ``Case.cancel_late``; half the time its retries run out first)
            out: tuple[Outcome, ...] = ("fatal",)
            if kind == "itself" and s.max_attempts > 1 and draw(st.booleans()):
                error: Outcome = "error"
                out = (error,) * s.max_attempts
            return replace(_tamed(s), outcomes=out, hold=kind == "itself")
        if s.id in tamed:
            s = _tamed(s)
        return replace(s, hold=False) if s.id in blocked else s

    return replace(case, stages=tuple(fit(s) for s in case.stages)), first_hold


def _tamed(s: StageCase) -> StageCase:
    """``s`` with every attempt succeeding: no failing step, every timeout caught, no gate
    that times out (its hold kept)."""
    ops = tuple(
        replace(op, fails=0)
        if isinstance(op, RunStep)
        else replace(op, catch=True)
        if isinstance(op, Wait)
        else op
        for op in s.ops
    )
    gate = None if s.gate == "timeout" else s.gate
    return replace(s, ops=ops, outcomes=("ok",), gate=gate)


def _names_again(ops: Sequence[Op], mode: str) -> list[str]:
    """The names of the stage's waits so far a new wait of ``mode`` may wait for again: any
    for a late wait (``after``, ``timeout``), one no late wait used for an early one."""
    late = {op.name for op in ops if isinstance(op, Wait) and op.mode in ("after", "timeout")}
    raced = {op.name for op in ops if isinstance(op, Wait) and op.mode == "race"}
    return list(
        dict.fromkeys(
            op.name
            for op in ops
            if isinstance(op, Wait)
            and op.name not in raced
            and (mode in ("after", "timeout") or op.name not in late)
        )
    )


def _share_gates(draw: Any, stages: list[StageCase], layers: list[list[str]]) -> list[StageCase]:
    """Three times in four, a ``before`` or ``after`` gate of a later group waits for the
    signal name of a gate of an earlier group (``StageCase.gate_shares``), the rules kept: no
    two gates of one name in a group, its ``before`` gates before its ``after`` ones."""

    layer_of = {sid: k for k, layer in enumerate(layers) for sid in layer}
    out: list[StageCase] = []
    for s in stages:
        if s.gate in ("before", "after") and _pick(draw, [True, True, True, False]):
            names: dict[str, list[StageCase]] = {}  # by signal name, the gates drawn so far
            for o in out:
                if o.gate in ("before", "after"):
                    names.setdefault(o.gate_signal, []).append(o)
            fits = [
                n
                for n, gates in sorted(names.items())
                if all(layer_of[g.id] < layer_of[s.id] for g in gates)
                and (s.gate == "after" or all(g.gate == "before" for g in gates))
            ]
            if fits:
                shared = _pick(draw, fits)[len("gate_") :]
                out.append(replace(s, gate_shares=shared))
                continue
        out.append(s)
    return out


def bounded(case: Case, bound: int) -> Case:
    """``case`` with ``bound`` (``Case.bound``) and the rules of a bounded case: no ``local``
    stage, every wait of the run for a name of its own (``<stage>w<op index>``), no shared
    gate, no race (a race wait's signal may stay queued: it would count against the bound by
    chance): a plain caught timeout."""
    stages = []
    for s in case.stages:
        ops = tuple(
            replace(op, name=f"{s.id}w{i}", mode="timeout" if op.mode == "race" else op.mode)
            if isinstance(op, Wait)
            else op
            for i, op in enumerate(s.ops)
        )
        stages.append(replace(s, ops=ops, local=False, gate_shares=None))
    return replace(case, stages=tuple(stages), bound=bound)


def make_valid(case: Case, gaps: frozenset[str] = KNOWN_GAPS) -> Case:
    """Drop what would make a case hang: a hold with no stage later in its group to end the
    run (it would wait forever), and known gaps."""
    from ._model import LateSignalRefused, ModelError, early_signals, expect

    for _ in range(8):
        try:
            exp = expect(case)
        except LateSignalRefused:
            # a signal sent to a suspended wait would be refused: nothing would ever take
            # one, the run would wait forever; a bound one higher lets it in
            assert case.bound is not None
            case = replace(case, bound=case.bound + 1)
            continue
        except ModelError:
            # (a late cancel's stage holding with no failure after it: cancel it at once)
            case = replace(case, cancel_late=False) if case.cancel_late else _drop_holds(case)
            continue
        if case.cancel_late and not (exp.redrive and exp.status == "cancelled"):
            case = replace(case, cancel_late=False)  # (no failure after it: cancel at once)
            continue
        if early_signals(case) and any(
            case.stage(sid).gate == "timeout" for sid in groups_of(case)[0]
        ):
            # a first stage timing out on its gate fails the run ~400 ms after the start,
            # maybe before the runner sent the early signals (a loaded database): one sent to
            # the ended run raises RunNotActiveError. The later groups never run: their early
            # waits and gates become late ones (sent once suspended: never)
            case = _no_early_signals(case)
            continue
        if "failure_stops_siblings" in gaps and exp.status == "failed" and exp.stopped:
            case = _settle_group(case, exp.failed_stage)
            continue
        return case
    case = _drop_holds(replace(case, cancel=None, cancel_late=False))
    try:
        expect(case)
    except LateSignalRefused:
        return replace(case, bound=None)
    return case


def _no_early_signals(case: Case) -> Case:
    def late(s: StageCase) -> StageCase:
        ops = tuple(
            replace(op, mode="after")
            if isinstance(op, Wait) and op.mode in ("before", "during")
            else op
            for op in s.ops
        )
        return replace(s, ops=ops, gate="after" if s.gate == "before" else s.gate)

    return replace(case, stages=tuple(late(s) for s in case.stages))


def _settle_group(case: Case, failed: str | None) -> Case:
    """Make every sibling of the failed stage complete, and run the failed stage last."""
    group = next(g for g in groups_of(case) if failed in g)

    def tame(s: StageCase) -> StageCase:
        if s.id not in group or s.id == failed:
            return s
        ops = tuple(
            replace(op, fails=0)
            if isinstance(op, RunStep)
            else replace(op, catch=True)
            if isinstance(op, Wait)
            else op
            for op in s.ops
        )
        return replace(s, ops=ops, outcomes=("ok",), hold=False)

    order = [x for x in case.run_order() if x != failed]
    last = max((i for i, x in enumerate(order) if x in group), default=None)
    if last is None:
        order = list(case.run_order())
    else:
        order.insert(last + 1, failed or "")
    return replace(
        case,
        stages=tuple(tame(s) for s in case.stages),
        order=tuple(order),
        cancel=None if case.cancel in group else case.cancel,
    )


def _drop_holds(case: Case) -> Case:
    return replace(
        case,
        stages=tuple(replace(s, hold=s.hold and s.id == case.cancel) for s in case.stages),
    )


# Cases that once found a fault (in a driver, the model or the runner), tried first, as one
# batch made valid (``make_valid``), on every fuzz run before the generated ones. Add the
# shape that found a fault here with a line on what it found.
REGRESSIONS: tuple[Case, ...] = (
    # a redrive re-runs a gated stage (its gate passed, then its body failed) after a
    # sibling that held: the gate, journaled, is passed at once; the runner's barrier waited
    # for a second suspension on it and hung
    Case(
        stages=(StageCase("a", hold=True), StageCase("b", outcomes=("fatal",), gate="after")),
        order=("a", "b"),
        redrive=True,
        label="redriven gate",
    ),
    # a first stage timing out on its gate (400 ms) failed the run before the runner sent
    # the early signals on a loaded PostgreSQL: RunNotActiveError (``make_valid`` drops such
    # a gate when the case has early signals)
    Case(
        stages=(
            StageCase("a", gate="timeout", max_attempts=2),
            StageCase("b", after=("a",), ops=(Wait("b0", "before"),)),
        ),
        label="timeout gate vs early signals",
    ),
    # the same in a bounded case, whose early ``during`` signals are sent unguarded: a
    # first-group failure before they went raised RunNotActiveError
    bounded(
        Case(
            stages=(
                StageCase("a", gate="timeout"),
                StageCase("b", after=("a",), ops=(Wait("b0", "during"),)),
            ),
            label="early signals vs a first-group failure",
        ),
        1,
    ),
    # the same with no bound, in a case that redrives: the first stage failed for good
    # before the runner sent the early ``during`` signal, which the failed run refused
    # (RunNotActiveError, ignored for an unbounded case) and lost; the redriven run's wait
    # for it hung (WFE_FUZZ_SEED=2112 beside load). A redriven case's first group now waits
    # for every early signal, as a bounded one does
    Case(
        stages=(
            StageCase("a", outcomes=("fatal",)),
            StageCase("b", after=("a",), ops=(Wait("b0", "during"),)),
        ),
        order=("a", "b"),
        redrive=True,
        label="early signals vs a redriven failure",
    ),
    # a hold's signal after a redrive met a queue full of early signals: the model let it in
    # (the runner got SignalQueueFullError); it now refuses it and ``make_valid`` raises the
    # bound to 2
    bounded(
        Case(
            stages=(
                StageCase("a", hold=True),
                StageCase("b", outcomes=("fatal",)),
                StageCase("c", after=("a", "b"), ops=(Wait("c0", "before"),)),
            ),
            order=("a", "b", "c"),
            redrive=True,
            label="late signal vs a bounded queue after a redrive",
        ),
        1,
    ),
    # a cancel after a redrive (``Case.cancel_late``): the redriven run compensates the kept
    # stage again and ends cancelled, the stage blocked behind the cancelled one too. Its
    # gate journaled before the redrive, that one passes it at once: the model had it wait
    # on it again (seed 88211 on Temporal)
    Case(
        stages=(
            StageCase("a", compensation="ok"),
            StageCase("b", after=("a",), hold=True, gate="after"),
            StageCase("c", after=("a",), outcomes=("fatal",), gate="after"),
            StageCase("d", after=("b", "c")),
        ),
        order=("a", "b", "c", "d"),
        cancel="b",
        redrive=True,
        cancel_late=True,
        label="cancel after a redrive",
    ),
    # a local stage's wait signalled once its stage.suspended reached the sink, while the
    # workflow task that recorded it continued the run as new (WFE_FUZZ_CONTINUE_AS_NEW=1):
    # the server refused the continue, the task ran again with the signal handled first and
    # the local activity run again (its suspension read back), and Temporal answered
    # delivered=False (seed 88212 on Temporal, about 1 case in 25)
    Case(
        stages=(
            StageCase(
                "a",
                max_attempts=2,
                ops=(Wait("a0", "after", ms=100), Emit("a.e1", n=3)),
                outcomes=("ok", "fatal"),
                compensation="fail",
                value="true",
                local=True,
            ),
            StageCase(
                "b",
                after=("a",),
                max_attempts=2,
                ops=(
                    Wait("b0", "race", ms=400, catch=True, lag=550),
                    Wait("b0", "timeout", ms=400, catch=True),
                    Sleep("b1", ms=200),
                    Sleep("b2", ms=50),
                    RunStep("b3", fails=2),
                ),
                outcomes=("ok", "ok"),
                compensation="ok",
                hold=True,
                value="0.1",
            ),
            StageCase(
                "c",
                after=("a",),
                max_attempts=2,
                outcomes=("ok", "ok"),
                value="-1208925819614629174706176",
                gate="before",
            ),
        ),
        order=("a", "c", "b"),
        cancel="b",
        label="local wait signalled across a refused continue",
    ),
    # a first stage that fails for good at once (``local=True``: on Temporal inside the run's
    # first workflow task) ended the run before the runner sent a later stage's ``during``
    # signal: refused (RunNotActiveError), dropped, and after the redrive b waited for it for
    # good (runner: the first group's barrier now waits for the later groups' early signals;
    # seed 11 on Temporal, 150 cases)
    Case(
        stages=(
            StageCase("a", outcomes=("fatal",), local=True),
            StageCase("b", after=("a",), ops=(Wait("b0", "during"),)),
        ),
        redrive=True,
        label="early signal vs a local first stage that fails",
    ),
)


def regression_batch(gaps: frozenset[str] = KNOWN_GAPS) -> list[Case]:
    """``REGRESSIONS`` as the fuzzer tries them: each made valid."""
    return [make_valid(case, gaps) for case in REGRESSIONS]
