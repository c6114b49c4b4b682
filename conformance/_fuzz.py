"""The differential fuzzer: run generated cases on a real engine and compare each with the
reference model (``conformance._model``).

One batch of cases is registered in one ``Registry`` and run on ONE engine + worker of a
target (a ``Harness``), a bounded number of cases at once. Stage bodies run in this process
(the worker is in-process), so they synchronise on what the test process has seen in the
``MemorySink`` (see ``conformance._cases``); nothing is ordered by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from engine_port import (
    Event,
    MemorySink,
    NonRetryableError,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)
from engine_port.errors import RunNotActiveError, SignalQueueFullError, StepTimeoutError

from ._cases import Case, Emit, RunStep, Sleep, StageCase, Wait, groups_of, wait_keys
from ._harness import ExecutionLog, Harness, unique_id
from ._model import (
    FULL,
    Expected,
    bounded_plan,
    canonical,
    early_signals,
    expect,
    repeats_before_signals,
    signal_payload,
    stage_output,
    step_result,
)
from ._models import Num
from ._trace import normalise, run_summary

__all__ = [
    "FlakyStepError",
    "ScriptedError",
    "UndoError",
    "check_batch",
    "divergences",
    "run_batch",
]

_POLL = 0.02
_TERMINAL = ("run.completed", "run.failed", "run.cancelled")


class ScriptedError(Exception):
    """A stage attempt that the case scripts to fail (retryable)."""


class FlakyStepError(Exception):
    """A durable step body that the case scripts to raise."""


class UndoError(Exception):
    """A compensation that the case scripts to fail on every attempt."""


class _IndexedSink(MemorySink):
    """A MemorySink that also keeps each run's events apart, so many pollers stay cheap."""

    def __init__(self) -> None:
        super().__init__()
        self.by_run: dict[str, dict[str, Event]] = {}

    async def publish(self, events: Sequence[Event]) -> None:
        await super().publish(events)
        for e in events:
            self.by_run.setdefault(e.run_id, {}).setdefault(e.id, e)

    def run_events(self, run_id: str) -> list[Event]:
        return sorted(self.by_run.get(run_id, {}).values(), key=lambda e: e.seq)

    def has(self, run_id: str, type: str, stage: str | None = None, **data: Any) -> bool:
        for e in list(self.by_run.get(run_id, {}).values()):
            if (
                e.type == type
                and (stage is None or e.stage == stage)
                and all(e.data.get(k) == v for k, v in data.items())
            ):
                return True
        return False

    def count(self, run_id: str, types: tuple[str, ...]) -> int:
        return sum(e.type in types for e in list(self.by_run.get(run_id, {}).values()))

    def suspensions(self, run_id: str, stage: str, waiting_for: str) -> int:
        """How many times ``stage`` suspended waiting for ``waiting_for`` (a stage that waits
        for one signal name again suspends on it once per wait)."""
        return sum(
            e.type == "stage.suspended"
            and e.stage == stage
            and e.data.get("waiting_for") == waiting_for
            for e in list(self.by_run.get(run_id, {}).values())
        )


@dataclass
class _Runtime:
    """The test-process state one case's bodies synchronise on."""

    case: Case
    log: ExecutionLog
    sink: _IndexedSink
    deadline: float
    sent: set[str] = field(default_factory=set)  # the early signals sent, by step key
    redriven: str | None = None  # the stage redriven: its next attempt is scripted to succeed
    redrives: int = 0  # how many times the runner redrove the run so far
    fails_again: bool = False  # (``Case.refail``) this redrive's attempts fail for good
    # what the race waits and the timeout waits after them returned, by (stage, step key)
    raced: dict[tuple[str, str], Any] = field(default_factory=dict)
    # by stage id (its ``stage.started``) and gate key (suspensions on it): counts at the
    # last redrive, see ``_arrived``
    base: dict[str, int] = field(default_factory=dict)
    step_runs: dict[str, int] = field(default_factory=dict)
    starts: asyncio.Semaphore | None = None
    # the stages whose ``after`` gate the runner sent: the gate journaled the signal, so a
    # redrive of the stage passes it at once, without suspending on it again
    passed: set[str] = field(default_factory=set)

    async def _until(self, check: Any, what: str) -> None:
        while not check():
            if time.monotonic() > self.deadline:
                raise AssertionError(f"barrier timed out: {what}")
            await asyncio.sleep(_POLL)

    def _arrived(self, run_id: str, s: StageCase) -> bool:
        """``s`` started, and if it is gated ``after`` a signal, suspended on its gate (a gate
        waits before the body's barrier: whether a stage blocked behind a sibling that ends the
        run got there must not depend on timing). After a redrive: since it (``base``), or
        ``s`` completed before and is kept; a gate passed before (``passed``) is passed at
        once."""
        if self.sink.has(run_id, "stage.completed", s.id):
            return True
        if self._count(run_id, s.id, None) <= self.base.get(s.id, 0):
            return False
        if s.gate != "after" or s.id in self.passed:
            return True
        gate = f"signal:{s.gate_signal}"
        return self._count(run_id, s.id, gate) > self.base.get(s.gate_key, 0)

    def _count(self, run_id: str, sid: str, waiting_for: str | None) -> int:
        """``stage.started`` (``waiting_for`` None) or ``stage.suspended`` on it of ``sid``."""
        if waiting_for is not None:
            return self.sink.suspensions(run_id, sid, waiting_for)
        events = self.sink.run_events(run_id)
        return sum(e.type == "stage.started" and e.stage == sid for e in events)

    def redriven_now(self, run_id: str) -> None:
        """The runner redrives the run now: what the barriers count from."""
        for s in self.case.stages:
            self.base[s.id] = self._count(run_id, s.id, None)
            self.base[s.gate_key] = self._count(run_id, s.id, f"signal:{s.gate_signal}")
            self.base[s.hold_signal] = self._count(run_id, s.id, f"signal:{s.hold_signal}")

    def may_go_on(self, run_id: str, sid: str) -> bool:
        """Every sibling before ``sid`` in ``case.order`` settled (or none): completed, or
        suspended on a hold nobody ends (not the cancel target: that one stops the group). (In
        the first run that is the previous one settled; after a redrive a sibling kept
        completed may come between ``sid`` and one that runs again.)"""
        group = next(g for g in groups_of(self.case) if sid in g)
        order = [x for x in self.case.run_order() if x in group]
        return all(self._settled(run_id, x) for x in order[: order.index(sid)])

    def _settled(self, run_id: str, sid: str) -> bool:
        prev = self.case.stage(sid)
        return self.sink.has(run_id, "stage.completed", prev.id) or (
            prev.hold
            and not self.redrives  # (after a redrive its hold is sent: it completes)
            and (prev.id != self.case.cancel or self.case.cancel_late)
            and self.sink.has(
                run_id, "stage.suspended", prev.id, waiting_for=f"signal:{prev.hold_signal}"
            )
        )

    def cancel_due(self, run_id: str, redrives: int) -> bool:
        """The case cancels now: its cancel stage is suspended on its hold (since the last
        redrive; ``Case.cancel_late``: once the last of the ``redrives`` re-ran it)."""
        case = self.case
        if case.cancel is None or (case.cancel_late and self.redrives < redrives):
            return False
        target = case.stage(case.cancel)
        holding = self.sink.suspensions(run_id, target.id, f"signal:{target.hold_signal}")
        return holding > self.base.get(target.hold_signal, 0)

    async def barrier(self, run_id: str, sid: str) -> None:
        """Every sibling started (a gated one: suspended on its gate), and the previous
        sibling in ``case.order`` settled (in the first group also: every ``before`` signal
        sent)."""
        groups = groups_of(self.case)
        group = next(g for g in groups if sid in g)
        if group is groups[0]:
            # (a bounded case: every early signal, so that none is taken while they are sent;
            # else every one but the ``during`` ones of the first group, which race its bodies:
            # a first stage that fails for good at once, a ``local=True`` one on Temporal, ended
            # the run before the runner sent a later stage's ``during`` signal, refused with
            # RunNotActiveError and dropped, and the redriven run waited for it for good; in a
            # case that redrives, those of the first group too: a sibling that failed first
            # had them refused the same way, seen beside load with WFE_FUZZ_SEED=2112)
            every = self.case.bound is not None or self.case.redrive
            before = {
                key
                for sid_, _, mode, key in early_signals(self.case)
                if mode == "before" or every or sid_ not in group
            }
            await self._until(lambda: before <= self.sent, "early signals sent")
        siblings = [self.case.stage(x) for x in group if x != sid]
        await self._until(
            lambda: all(self._arrived(run_id, x) for x in siblings),
            f"siblings of {sid} started",
        )
        await self._until(lambda: self.may_go_on(run_id, sid), f"{sid}'s predecessor settled")


def early_waits(case: Case) -> list[tuple[str, str, str]]:
    """The signals the runner sends right after the start, in this order (signals of one name
    are taken oldest first: stages are listed in group order, a stage's waits in body order):
    (signal name, mode, key) for each ``before`` and ``during`` wait (key: its step key) and
    each ``before`` gate (key: its ``gate_key``). The key names the wait in the payload
    (``signal_payload``) and is a ``before`` signal's idempotency key."""
    return [(name, mode, key) for _, name, mode, key in early_signals(case)]


def after_waits(case: Case) -> list[tuple[str, str, int, str]]:
    """The signals the runner sends once a wait suspended: (stage, signal name, k, step key)
    for each ``after`` wait, the k-th late wait for its name in its stage (``timeout`` ones
    count: they suspend on it too; the early ones, ``before`` and ``during``, all come first
    and take the early signals without suspending, see ``Wait``). Its signal goes once the
    stage suspended on the name k times, with the step key as the idempotency key (one key
    for two waits would not queue the second signal) and its payload (``signal_payload``)."""
    out: list[tuple[str, str, int, str]] = []
    for s in case.stages:
        waits: dict[str, int] = {}
        for op, key in zip(s.ops, wait_keys(s.ops), strict=True):
            if (
                not isinstance(op, Wait)
                or key is None
                or op.mode not in ("after", "timeout", "race")
            ):
                continue
            k = waits[op.name] = waits.get(op.name, 0) + 1
            if op.mode == "after":
                out.append((s.id, op.name, k, key))
    return out


_GATE_TIMEOUT = timedelta(milliseconds=400)  # ``StageCase.gate == "timeout"``


def _build(case: Case, rt: _Runtime) -> Workflow[Num]:
    wf: Workflow[Num] = Workflow(unique_id("fz"), input=Num)
    built: dict[str, Any] = {}
    for s in case.stages:  # stages are listed in topological order
        stage = wf.stage(
            id=s.id,
            after=[built[d] for d in s.after],
            local=s.local,
            after_signal=s.gate_signal if s.gate is not None else None,
            after_signal_timeout=_GATE_TIMEOUT if s.gate == "timeout" else None,
            # (a gate declares its signal, and once one stage declares, the run refuses a name
            # none declares: every stage declares the signals it waits for, each once)
            signals=list(dict.fromkeys(op.name for op in s.ops if isinstance(op, Wait)))
            + ([s.hold_signal] if s.hold else []),
            retry=Retry(
                max_attempts=s.max_attempts,
                initial_interval=timedelta(milliseconds=s.interval_ms),
                backoff=2.0,
            ),
        )(_body(s, rt))
        if s.compensation is not None:
            stage.compensation(_undo(s, rt))
        built[s.id] = stage
    return wf


def _step_fn(s: StageCase, op: RunStep, rt: _Runtime) -> Any:
    key = f"{s.id}.{op.name}"

    async def step() -> Any:
        rt.log.hit(f"step:{key}")
        rt.step_runs[key] = rt.step_runs.get(key, 0) + 1
        if rt.step_runs[key] <= op.fails:
            raise FlakyStepError(f"step {key} fails on run {rt.step_runs[key]}")
        return step_result(s, key)

    return step


async def _emit(ctx: StageContext[Num], op: Emit) -> None:
    def stage() -> None:
        ctx.emit(op.type, {"n": op.n})

    if op.in_step:  # (a replay returns the step's journaled result and stages it again)
        await ctx.step.run(f"emit-{op.type}", stage)
    else:
        stage()


async def _wait(ctx: StageContext[Num], op: Wait, key: str, rt: _Runtime) -> Any:
    if op.mode == "during":  # (its signal, and those of the earlier waits for the name)
        await rt._until(lambda: key in rt.sent, f"{key} sent")
    timeout = timedelta(milliseconds=op.ms) if op.mode in ("timeout", "race") else None
    try:
        return await ctx.step.wait_for_signal(op.name, timeout=timeout)
    except StepTimeoutError:
        if not op.catch:
            raise
        return None


def _body(s: StageCase, rt: _Runtime) -> Any:
    async def body(ctx: StageContext[Num]) -> dict[str, Any]:
        await rt.barrier(ctx.run_id, s.id)
        rt.log.hit(f"body:{s.id}")
        got: list[Any] = []
        if s.gate is not None:  # the gate journaled it: returns at once
            got.append(await ctx.step.wait_for_signal(s.gate_signal))
        for op, key in zip(s.ops, wait_keys(s.ops), strict=True):
            if isinstance(op, RunStep):
                got.append(await ctx.step.run(op.name, _step_fn(s, op, rt)))
            elif isinstance(op, Sleep):
                await ctx.step.sleep(op.name, timedelta(milliseconds=op.ms))
            elif isinstance(op, Emit):
                await _emit(ctx, op)
            elif isinstance(op, Wait):
                assert key is not None
                got.append(await _wait(ctx, op, key, rt))
                rt.raced[s.id, key] = got[-1]
        if rt.redriven == s.id:
            outcome = "fatal" if rt.fails_again else "ok"
        else:
            outcome = s.outcome(ctx.attempt)
        # (a late cancel's stage reaches its hold only in an attempt scripted to succeed: it
        # may be the stage that fails for good, then holds once redriven, ``Case.cancel_late``)
        late = s.id == rt.case.cancel and rt.case.cancel_late and outcome != "ok"
        if s.hold and not late:
            await ctx.step.wait_for_signal(s.hold_signal)
        if outcome == "error":
            raise ScriptedError(f"{s.id} attempt {ctx.attempt} scripted to fail")
        if outcome == "fatal":
            raise NonRetryableError(f"{s.id} attempt {ctx.attempt} scripted to fail for good")
        for d in s.after:
            assert ctx.output_of(d)["id"] == d
        return stage_output(s, ctx.attempt, got)

    body.__name__ = s.id
    return body


def _undo(s: StageCase, rt: _Runtime) -> Any:
    async def undo(ctx: StageContext[Num], output: dict[str, Any]) -> None:
        rt.log.hit(f"comp:{s.id}")
        if s.compensation == "fail":
            raise UndoError(f"cannot undo {s.id}")

    return undo


@dataclass
class _Result:
    case: Case
    expected: Expected | None
    actual: dict[str, Any] | None
    error: str | None = None


async def _start(engine: Any, wf: Workflow[Num], rt: _Runtime) -> Any:
    """Start the case's run. A few starts at a time, retried while the backing service says it
    is rate limited: on Temporal each generated workflow registers its own Worker Deployment
    version, and the dev server limits that API (an infrastructure limit, not the contract)."""
    assert rt.starts is not None
    for attempt in range(8):
        async with rt.starts:
            try:
                return await engine.start(wf.id, {})
            except Exception as exc:
                if "rate limit" not in str(exc).lower() or attempt == 7:
                    raise
        await asyncio.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


@dataclass
class _Signals:
    """The case's signals to one run, and what each ``engine.signal`` answered
    ([delivered, already_completed] by name: compared with ``Expected.signals``)."""

    engine: Any
    run_id: str
    answers: dict[str, list[Any]] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)  # (keys) SignalQueueFullError

    async def send(self, name: str, key: str | None = None, step: str | None = None) -> bool:
        """Send ``name`` with the payload of the wait journaled as ``step`` (default: the
        first wait for the name; see ``signal_payload``); False: refused, the run's queue is
        full (the answer is ``FULL``)."""
        try:
            res = await self.engine.signal(
                self.run_id, name, signal_payload(step or name), idempotency_key=key
            )
        except SignalQueueFullError:
            self.answers.setdefault(name, []).append(FULL)
            self.refused.add(step or name)
            return False
        self.answers.setdefault(name, []).append([res.delivered, res.already_completed])
        return True

    async def early(self, case: Case, rt: _Runtime, waits: list[tuple[str, str, str]]) -> None:
        """The ``before`` signals (each repeated with its key, see
        ``repeats_before_signals``) and the ``during`` ones, right after the start, one
        after the other in ``early_waits`` order (a bounded case: every answer kept)."""
        repeat = repeats_before_signals(case)
        for name, mode, key in waits:
            if mode == "before":
                await self.send(name, key=key if repeat else None, step=key)
                if repeat:  # a sender's retry: not queued again
                    await self.send(name, key=key, step=key)
            elif case.bound is not None:
                await self.send(name, step=key)
            else:
                with contextlib.suppress(RunNotActiveError):
                    await self.engine.signal(self.run_id, name, signal_payload(key))
            rt.sent.add(key)


def race_waits(case: Case) -> list[tuple[str, str, str, int]]:
    """(stage, signal name, step key, lag ms) of each ``race`` wait (``Wait``)."""
    return [
        (s.id, op.name, key, op.lag)
        for s in case.stages
        for op, key in zip(s.ops, wait_keys(s.ops), strict=True)
        if isinstance(op, Wait) and key is not None and op.mode == "race"
    ]


def race_outcomes(rt: _Runtime, run_id: str) -> dict[str, str]:
    """What became of each race wait's signal (``conformance._model.RACE_OUTCOMES``), from
    what the race wait and the timeout wait after it returned and how often the stage
    suspended on the name; a race wait never reached: ``took`` (the model never asks)."""
    out: dict[str, str] = {}
    for sid, name, key, _ in race_waits(rt.case):
        mine = signal_payload(key)
        after = [v for (st, k), v in rt.raced.items() if st == sid and k.startswith(f"{name}#")]
        if rt.raced.get((sid, key)) == mine:
            out[key] = "took"
        elif mine in after:
            once = rt.sink.suspensions(run_id, sid, f"signal:{name}") == 1
            out[key] = "queued" if once else "late"
        elif (sid, key) in rt.raced:
            out[key] = "left"
    return out


class _Outside:
    """What the runner sends beside the waits' and gates' signals: each race wait's signal
    (``lag`` ms after its suspension reached the sink, in a task of its own), and, after a
    redrive, each hold's signal once the stage suspended on it again (``_Sim.release``); a
    gate a sibling's failure cancelled waits on it again after the redrive: its signal goes
    once it did (``gate_due``)."""

    def __init__(self, engine: Any, run_id: str, rt: _Runtime, races: list[Any]) -> None:
        self.engine, self.run_id, self.rt, self.races = engine, run_id, rt, races
        self.racing: list[asyncio.Task[None]] = []
        self.holds: list[StageCase] = []
        self.base: dict[str, int] = {}  # suspensions on its gate or hold before the redrive

    def _suspensions(self, sid: str, name: str) -> int:
        return self.rt.sink.suspensions(self.run_id, sid, f"signal:{name}")

    async def _race(self, name: str, key: str, lag: int) -> None:
        await asyncio.sleep(lag / 1000)  # (not to order anything: either outcome is right)
        with contextlib.suppress(RunNotActiveError):  # (the run ended: the signal is left)
            await self.engine.signal(self.run_id, name, signal_payload(key), idempotency_key=key)

    async def tick(self) -> None:
        for item in list(self.races):
            sid, name, key, lag = item
            if self._suspensions(sid, name) >= 1:
                self.races.remove(item)
                self.racing.append(asyncio.create_task(self._race(name, key, lag)))
        for s in list(self.holds):
            if self._suspensions(s.id, s.hold_signal) > self.base[s.hold_signal]:
                self.holds.remove(s)
                await self.engine.signal(self.run_id, s.hold_signal, {})

    def gate_due(self, s: StageCase) -> bool:
        """The ``after`` gate of ``s`` is suspended (since the last redrive) and its body's
        barrier would let it go on."""
        waiting = self._suspensions(s.id, s.gate_signal) > self.base.get(s.gate_key, 0)
        return waiting and self.rt.may_go_on(self.run_id, s.id)

    def redriven(self, gates: list[StageCase]) -> None:
        self.rt.redriven_now(self.run_id)
        self.base = {s.gate_key: self._suspensions(s.id, s.gate_signal) for s in gates}
        self.holds = [s for s in self.rt.case.stages if s.hold and s.id != self.rt.case.cancel]
        self.base.update(
            {s.hold_signal: self._suspensions(s.id, s.hold_signal) for s in self.holds}
        )

    async def settle(self) -> None:
        for task in self.racing:
            await task


async def _drive(
    case: Case, wf: Workflow[Num], rt: _Runtime, exp: Expected, engine: Any
) -> dict[str, Any]:
    sink = rt.sink
    run = await _start(engine, wf, rt)
    signals = _Signals(engine, run.id)
    await signals.early(case, rt, early_waits(case))
    if case.bound is not None:
        # the refused early signals' waits and gates suspend: their signals go once they did
        case = rt.case = bounded_plan(case, signals.refused)[0]
    pending = after_waits(case)
    gates = [s for s in case.stages if s.gate == "after"]
    cancelled = False
    terminals = 1 + exp.redrives
    outside = _Outside(engine, run.id, rt, race_waits(case))

    async def late(name: str, key: str) -> None:
        nonlocal cancelled, terminals
        if not await signals.send(name, key=key, step=key) and not cancelled:
            # refused: nothing would ever take one, the run would wait forever (the answer
            # shows the divergence)
            cancelled, terminals = True, 1
            await engine.cancel(run.id)

    while True:
        if time.monotonic() > rt.deadline:
            seen = [[e.type, e.stage, e.data.get("waiting_for")] for e in sink.run_events(run.id)]
            raise AssertionError(f"the run did not end in time; its events so far: {seen}")
        for item in list(pending):
            sid, name, k, key = item
            if sink.suspensions(run.id, sid, f"signal:{name}") >= k:
                pending.remove(item)
                await late(name, key)
        await outside.tick()
        for s in list(gates):  # once its body's barrier would let it go on
            if outside.gate_due(s):
                gates.remove(s)
                rt.passed.add(s.id)
                await late(s.gate_signal, s.gate_key)
        if not cancelled and rt.cancel_due(run.id, exp.redrives):
            cancelled = True
            await engine.cancel(run.id)
        done = sink.count(run.id, _TERMINAL)
        if done >= terminals:
            break
        if done == rt.redrives + 1 and rt.redrives < exp.redrives:
            first = await engine.wait(run.id, timeout=60)
            if first.status != RunStatus.FAILED:
                break
            rt.redriven = exp.failed_stage
            rt.redrives += 1
            rt.fails_again = rt.redrives < exp.redrives
            outside.redriven(gates)
            await engine.redrive(run.id, from_="last_failure")
        await asyncio.sleep(_POLL)
    await outside.settle()
    info = await engine.wait(run.id, timeout=60)
    events = sink.run_events(run.id)
    entries = rt.log.entries()
    return {
        "run_id": run.id,
        "signals": dict(sorted(signals.answers.items())),
        "run": run_summary(info),
        "output": info.output if info.status == RunStatus.COMPLETED else None,
        "trace": canonical(normalise(events, wf.graph())),
        "counts": dict(sorted(rt.log.counts().items())),
        "compensations": [e for e in entries if e.startswith("comp:")],
    }


async def run_batch(
    harness: Harness,
    batch: Sequence[Case],
    *,
    concurrency: int = 8,
    case_timeout: float = 120.0,
    start_concurrency: int = 8,
    settings: dict[str, Any] | None = None,
) -> list[_Result]:
    """Run ``batch`` on one engine + worker of ``harness``; return one result per case."""
    sink = _IndexedSink()
    workdir = Path(tempfile.mkdtemp(prefix="wfe-fuzz-"))
    prepared: list[tuple[Case, Workflow[Num], _Runtime, Expected]] = []
    results: list[_Result] = []
    for i, case in enumerate(batch):
        try:
            exp = expect(case)
        except Exception as exc:  # the generator should never produce these
            results.append(_Result(case, None, None, f"model: {exc!r}"))
            continue
        rt = _Runtime(case, ExecutionLog(workdir / f"case{i}.log"), sink, deadline=0.0)
        prepared.append((case, _build(case, rt), rt, exp))
    gate = asyncio.Semaphore(concurrency)
    starts = asyncio.Semaphore(start_concurrency)

    async def one(case: Case, wf: Workflow[Num], rt: _Runtime, exp: Expected) -> _Result:
        async with gate:
            rt.deadline = time.monotonic() + case_timeout
            rt.starts = starts
            try:
                actual = await _drive(case, wf, rt, exp, engine)
                if race_waits(case):  # the model predicts the rest from what the race did
                    exp = expect(case, races=race_outcomes(rt, actual["run_id"]))
            except Exception as exc:
                return _Result(case, exp, None, f"{type(exc).__name__}: {exc}")
            return _Result(case, exp, actual)

    # one engine per ``Case.bound`` (its ``max_pending_signals``), one after the other
    bounds = sorted({p[0].bound for p in prepared}, key=lambda b: -1 if b is None else b)
    for bound in bounds:
        part = [p for p in prepared if p[0].bound == bound]
        registry = Registry([wf for _, wf, _, _ in part])
        options = dict(settings or {})
        if bound is not None:
            options["max_pending_signals"] = bound
        async with harness.engine(registry, sink, **options) as engine, engine.worker():
            results.extend(await asyncio.gather(*(one(*p) for p in part)))
    return results


def divergences(results: Sequence[_Result], target: str) -> list[str]:
    """A readable report of every case whose observation differs from the model's."""
    out = []
    for r in results:
        if r.expected is not None and r.actual is not None:
            want = r.expected.observation()
            got = r.actual
            keys = [k for k in want if want[k] != got[k]]
            if not keys:
                continue
            detail = "\n".join(_diff(k, want[k], got[k]) for k in keys)
        else:
            detail = f"  {r.error}"
        out.append(f"--- on {target}:\n{r.case.to_python()}\n{detail}")
    return out


def _diff(key: str, want: Any, got: Any) -> str:
    if isinstance(want, list) and isinstance(got, list):
        i = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
        i = min(len(want), len(got)) if i is None else i
        return (
            f"  {key} (first difference at [{i}], after {json.dumps(want[max(0, i - 2) : i])}):"
            f"\n    expected {json.dumps(want[i:])}\n    actual   {json.dumps(got[i:])}"
        )
    return f"  {key}:\n    expected {json.dumps(want)}\n    actual   {json.dumps(got)}"


def check_batch(results: Sequence[_Result], target: str) -> None:
    problems = divergences(results, target)
    if problems:
        raise AssertionError(
            f"{len(problems)} of {len(results)} generated cases diverge from the model on "
            f"{target}:\n" + "\n".join(problems)
        )
