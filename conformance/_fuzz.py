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
    step_runs: dict[str, int] = field(default_factory=dict)
    starts: asyncio.Semaphore | None = None

    async def _until(self, check: Any, what: str) -> None:
        while not check():
            if time.monotonic() > self.deadline:
                raise AssertionError(f"barrier timed out: {what}")
            await asyncio.sleep(_POLL)

    def _arrived(self, run_id: str, s: StageCase) -> bool:
        """``s`` started, and if it is gated ``after`` a signal, suspended on its gate (a gate
        waits before the body's barrier: whether a stage blocked behind a sibling that ends the
        run got there must not depend on timing)."""
        if not self.sink.has(run_id, "stage.started", s.id):
            return False
        return s.gate != "after" or self.sink.has(
            run_id, "stage.suspended", s.id, waiting_for=f"signal:{s.gate_signal}"
        )

    def may_go_on(self, run_id: str, sid: str) -> bool:
        """The previous sibling of ``sid`` in ``case.order`` settled (or none): completed, or
        suspended on a hold nobody ends (not the cancel target: that one stops the group)."""
        group = next(g for g in groups_of(self.case) if sid in g)
        order = [x for x in self.case.run_order() if x in group]
        i = order.index(sid)
        if i == 0:
            return True
        prev = self.case.stage(order[i - 1])
        return self.sink.has(run_id, "stage.completed", prev.id) or (
            prev.hold
            and prev.id != self.case.cancel
            and self.sink.has(
                run_id, "stage.suspended", prev.id, waiting_for=f"signal:{prev.hold_signal}"
            )
        )

    async def barrier(self, run_id: str, sid: str) -> None:
        """Every sibling started (a gated one: suspended on its gate), and the previous
        sibling in ``case.order`` settled (in the first group also: every ``before`` signal
        sent)."""
        groups = groups_of(self.case)
        group = next(g for g in groups if sid in g)
        if group is groups[0]:
            # (a bounded case: every early signal, so that none is taken while they are sent)
            bounded = self.case.bound is not None
            early = early_waits(self.case)
            before = {key for _, mode, key in early if mode == "before" or bounded}
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
            if not isinstance(op, Wait) or key is None or op.mode not in ("after", "timeout"):
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
    timeout = timedelta(milliseconds=op.ms) if op.mode == "timeout" else None
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
        if s.hold:
            await ctx.step.wait_for_signal(s.hold_signal)
        outcome = "ok" if rt.redriven == s.id else s.outcome(ctx.attempt)
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
    terminals = 2 if exp.redrive else 1

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
        for s in list(gates):  # once its body's barrier would let it go on
            if sink.has(
                run.id, "stage.suspended", s.id, waiting_for=f"signal:{s.gate_signal}"
            ) and rt.may_go_on(run.id, s.id):
                gates.remove(s)
                await late(s.gate_signal, s.gate_key)
        if case.cancel and not cancelled:
            target = case.stage(case.cancel)
            if sink.has(
                run.id, "stage.suspended", target.id, waiting_for=f"signal:{target.hold_signal}"
            ):
                cancelled = True
                await engine.cancel(run.id)
        done = sink.count(run.id, _TERMINAL)
        if done >= terminals:
            break
        if done == 1 and exp.redrive and not rt.redriven:
            first = await engine.wait(run.id, timeout=60)
            if first.status != RunStatus.FAILED:
                break
            rt.redriven = exp.failed_stage
            await engine.redrive(run.id, from_="last_failure")
        await asyncio.sleep(_POLL)
    info = await engine.wait(run.id, timeout=60)
    events = sink.run_events(run.id)
    entries = rt.log.entries()
    return {
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
