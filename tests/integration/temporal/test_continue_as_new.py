"""Continue-as-new: a long-lived run goes on in new executions of its workflow id once its
history holds ``continue_as_new_events`` events (here 100), at a safe point, invisibly to its
user: the same events (ids, sequence, order) as a run that never continued, journaled steps
run once, signals and their idempotency keys kept, timers kept in absolute time, the version
pin kept, and every read (get_run, wait, events, steps) right."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel

from conformance._trace import normalise
from driver_temporal import TemporalEngine
from engine_port import MemorySink, Registry, RunInfo, RunStatus, StageContext, Workflow
from engine_port.errors import ConfigurationError

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal

LOW = 100  # history events before a run continues as new (the default: thousands)
POLLS = 14
SIGNALS = 36
NAP_S = 4.0
WARM = 12
LOW_POLL = 60  # (the poll and sleep cases: a poll takes ~1 s on the dev server)


class In(BaseModel):
    n: int


class Calls:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def hit(self, what: str) -> int:
        self.counts[what] = self.counts.get(what, 0) + 1
        return self.counts[what]


def poll_workflow(calls: Calls) -> Workflow[In]:
    wf = Workflow(f"can-poll-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage
    async def p(ctx: StageContext[In]) -> int:
        base = await ctx.step.run("before", lambda: calls.hit("before") and ctx.input.n)

        def check() -> int | None:
            n = calls.hit("check")
            return n if n >= POLLS else None

        polled = await ctx.step.wait_for("settled", check, interval=0.05, timeout=600)
        return int(base) + int(polled)

    @wf.stage(after=[p])
    async def q(ctx: StageContext[In]) -> dict[str, Any]:
        calls.hit("q")
        return {"total": ctx.output_of("p")}

    return wf


def signal_workflow(calls: Calls) -> Workflow[In]:
    wf = Workflow(f"can-signals-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage(signals=["go"])
    async def s(ctx: StageContext[In]) -> int:
        await ctx.step.run("before", lambda: calls.hit("before"))
        total = 0
        for _ in range(SIGNALS):
            got = await ctx.step.wait_for_signal("go", timeout=600)
            total += int(got["v"])
        return total

    return wf


def sleep_workflow(calls: Calls) -> Workflow[In]:
    wf = Workflow(f"can-sleep-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage
    async def z(ctx: StageContext[In]) -> str:
        await ctx.step.run("before", lambda: calls.hit("before"))
        await ctx.step.sleep("nap", NAP_S)
        calls.hit("after-nap")
        return "rested"

    @wf.stage
    async def w(ctx: StageContext[In]) -> int:
        # a sibling that polls all along: the run continues as new while z sleeps
        return int(
            await ctx.step.wait_for(
                "warm", lambda: calls.hit("warm") >= WARM or None, interval=0.05, timeout=600
            )
        )

    return wf


async def executions(engine: TemporalEngine, run_id: str) -> list[Any]:
    """The Temporal executions of the run's workflow id (visibility), oldest first."""
    found = [ex async for ex in engine._conn.list_workflows(f'WorkflowId = "{run_id}"')]
    return sorted(found, key=lambda ex: ex.start_time)


def refused_in(history: Any) -> int:
    """How many workflow tasks of one execution's history the server refused for a command
    it could not take then (a continue-as-new or an end with a signal come meanwhile)."""
    return sum(
        1
        for e in history.events
        if e.HasField("workflow_task_failed_event_attributes")
        and "UNHANDLED_COMMAND" in str(e.workflow_task_failed_event_attributes)
    )


async def refused_continues(engine: TemporalEngine, run_id: str) -> int:
    """:func:`refused_in` over every execution of the run."""
    refused = 0
    for ex in await executions(engine, run_id):
        handle = engine._conn.get_workflow_handle(run_id, run_id=ex.run_id)
        refused += refused_in(await handle.fetch_history())
    return refused


async def until(what: str, probe: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def continued(engine: TemporalEngine, run_id: str) -> int:
    """How many executions the run has once it continued as new at least once (a deadline of
    180 s: a run that takes a thousand queued signals first took over 60 s on a clean clone
    beside a CPU hog)."""

    async def more_than_one() -> bool:
        return len(await executions(engine, run_id)) > 1

    await until(f"a continue-as-new of {run_id}", more_than_one, timeout=180.0)
    return len(await executions(engine, run_id))


async def check_pin(engine: TemporalEngine, run_id: str, version: str) -> None:
    """The latest execution is still PINNED to the run's Worker Deployment version."""
    desc = await engine._conn.get_workflow_handle(run_id).describe()
    vi = desc.raw_description.workflow_execution_info.versioning_info
    override = vi.versioning_override
    build = override.pinned.version.build_id or override.pinned_version.rsplit(":", 1)[-1]
    assert build == version, vi


async def reference(
    make_engine: EngineFactory,
    factory: Callable[[Calls], Workflow[In]],
    drive: Callable[[TemporalEngine, MemorySink, RunInfo], Awaitable[None]] | None = None,
) -> tuple[list[list[Any]], RunInfo, list[Any], Calls]:
    """The same workflow run at the default threshold (it never continues as new)."""
    calls = Calls()
    wf = factory(calls)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, task_queue=f"ref-{time.monotonic_ns()}")
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            if drive is not None:
                await drive(engine, sink, run)
            info = await engine.wait(run.id, timeout=120)
        assert len(await executions(engine, run.id)) == 1
        steps = [(s.stage, s.name, s.completed) for s in await engine.steps(run.id)]
    return normalise(sink.for_run(run.id), wf.graph()), info, steps, calls


async def check_reads(
    engine: TemporalEngine, sink: MemorySink, wf: Workflow[In], run: RunInfo
) -> None:
    """events() and the sink agree with each other (ids, seq 1..n)."""
    read = await engine.events(run.id)
    delivered = sink.for_run(run.id)
    assert [e.id for e in read] == [e.id for e in delivered]
    assert [e.seq for e in read] == list(range(1, len(read) + 1))
    assert normalise(read, wf.graph()) == normalise(delivered, wf.graph())


async def test_poll_continues_as_new(make_engine: EngineFactory) -> None:
    ref_trace, ref_info, ref_steps, ref_calls = await reference(make_engine, poll_workflow)
    assert ref_calls.counts == {"before": 1, "check": POLLS, "q": 1}

    calls = Calls()
    wf = poll_workflow(calls)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": LOW_POLL})
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            assert await continued(engine, run.id) > 1
            # read while it waits, after a continue-as-new
            info = await engine.get_run(run.id)
            if info.status == RunStatus.SUSPENDED:
                (p, q) = info.stages
                assert p.status == "suspended" and p.waiting_for == "poll:settled", p
                assert p.attempt == 1 and q.status == "pending"
            elif info.status == RunStatus.RUNNING:
                # (the read fell in a poll's check or in q: a window a loaded host widens;
                # failed on a clean clone beside a CPU hog)
                assert "running" in [s.status for s in info.stages], info
            else:
                assert info.status == RunStatus.COMPLETED, info
            await check_pin(engine, run.id, wf.version)
            done = await engine.wait(run.id, timeout=120)
        assert done.status == RunStatus.COMPLETED, done
        assert done.output == ref_info.output == {"total": 1 + POLLS}
        assert calls.counts == {"before": 1, "check": POLLS, "q": 1}
        assert normalise(sink.for_run(run.id), wf.graph()) == ref_trace
        assert len(await executions(engine, run.id)) >= 3  # ~12 events a poll, 60 an execution
        await check_reads(engine, sink, wf, run)
        assert [(s.stage, s.name, s.completed) for s in await engine.steps(run.id)] == ref_steps
        assert (await engine.get_run(run.id)).model_dump() == done.model_dump()


async def _signal_each(
    engine: TemporalEngine,
    sink: MemorySink,
    run: RunInfo,
    *,
    repeat_after_continue: bool,
) -> list[bool]:
    """Send the run's signals one at a time, each once its wait suspended for it (so both
    runs take the same path); a repeat of the first key once the run continued as new."""
    repeats: list[bool] = []
    for i in range(SIGNALS):

        def suspended(k: int = i) -> Awaitable[bool]:
            async def probe() -> bool:
                events = sink.for_run(run.id)
                return sum(1 for e in events if e.type == "stage.suspended") >= k + 1

            return probe()

        await until(f"the wait for signal {i}", suspended)
        res = await engine.signal(run.id, "go", {"v": i}, idempotency_key=f"k{i}")
        assert not res.already_completed, (i, res)
        if i == SIGNALS - 5 and repeat_after_continue:
            assert len(await executions(engine, run.id)) > 1
            again = await engine.signal(run.id, "go", {"v": 1000}, idempotency_key="k0")
            repeats.append(again.already_completed)
    return repeats


async def test_signals_continue_as_new(make_engine: EngineFactory) -> None:
    async def drive(engine: TemporalEngine, sink: MemorySink, run: RunInfo) -> None:
        await _signal_each(engine, sink, run, repeat_after_continue=False)

    ref_trace, ref_info, ref_steps, ref_calls = await reference(make_engine, signal_workflow, drive)
    want = sum(range(SIGNALS))
    assert ref_info.output == want

    calls = Calls()
    wf = signal_workflow(calls)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": LOW})
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            repeats = await _signal_each(engine, sink, run, repeat_after_continue=True)
            assert repeats == [True]  # the key was kept across continue-as-new
            await check_pin(engine, run.id, wf.version)
            done = await engine.wait(run.id, timeout=120)
        assert done.status == RunStatus.COMPLETED, done
        assert done.output == want
        assert calls.counts == ref_calls.counts == {"before": 1}
        assert normalise(sink.for_run(run.id), wf.graph()) == ref_trace
        assert len(await executions(engine, run.id)) >= 3
        await check_reads(engine, sink, wf, run)
        steps = [(s.stage, s.name, s.completed) for s in await engine.steps(run.id)]
        assert steps == ref_steps and len(steps) == SIGNALS + 1


async def test_sleep_across_continue_as_new(make_engine: EngineFactory) -> None:
    ref_trace, ref_info, _, ref_calls = await reference(make_engine, sleep_workflow)
    assert ref_calls.counts == {"before": 1, "warm": WARM, "after-nap": 1}

    calls = Calls()
    wf = sleep_workflow(calls)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": LOW_POLL})
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():

            async def napping() -> bool:
                return any(e.data.get("waiting_for") == "sleep:nap" for e in sink.for_run(run.id))

            await until("the nap", napping)
            (nap,) = [e for e in sink.for_run(run.id) if e.data.get("waiting_for") == "sleep:nap"]
            wake_at = datetime.fromisoformat(nap.data["until"])

            async def continued_in_nap() -> bool:
                return any(nap.at < ex.start_time for ex in await executions(engine, run.id))

            await until("a continue-as-new during the nap", continued_in_nap)
            info = await engine.get_run(run.id)
            z = info.stages[[s.id for s in info.stages].index("z")]
            if z.status == "suspended":
                assert z.waiting_for == "sleep:nap" and z.wake_at == wake_at, z
                assert info.status == RunStatus.SUSPENDED, info
            await check_pin(engine, run.id, wf.version)
            done = await engine.wait(run.id, timeout=120)
        assert done.status == RunStatus.COMPLETED, done
        assert done.output == ref_info.output
        assert calls.counts == {"before": 1, "warm": WARM, "after-nap": 1}
        assert normalise(sink.for_run(run.id), wf.graph()) == ref_trace
        z = done.stages[[s.id for s in done.stages].index("z")]
        assert z.finished_at is not None and z.finished_at >= wake_at
        # the timer kept its absolute time: not restarted at the continue-as-new
        assert (z.finished_at - wake_at).total_seconds() < 2.0, (z.finished_at, wake_at)
        await check_reads(engine, sink, wf, run)
        first = (await executions(engine, run.id))[0]
        handle = engine._conn.get_workflow_handle(run.id, run_id=first.run_id)
        close = (await handle.fetch_history()).events[-1]
        assert close.HasField("workflow_execution_continued_as_new_event_attributes"), close


async def test_a_continued_execution_continues_again_only_after_progress(
    make_engine: EngineFactory,
) -> None:
    """At a threshold a fresh execution already holds (1 event), a run waiting on a signal
    continued as new at every first safe point of each new execution, about once a second
    (Temporal's minimum interval), for as long as it waited. It continues once, then waits;
    a signal is progress: it may continue again after it."""
    calls = Calls()
    wf = Workflow(f"can-tiny-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage(signals=["go"])
    async def s(ctx: StageContext[In]) -> int:
        calls.hit("s")
        got = await ctx.step.wait_for_signal("go", timeout=600)
        return int(got["v"])

    engine = make_engine(Registry([wf]), options={"continue_as_new_events": 1})
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            assert await continued(engine, run.id) == 2
            # (a bounded look: before, a third execution came within about a second)
            quiet_until = time.monotonic() + 4.0
            while time.monotonic() < quiet_until:
                assert len(await executions(engine, run.id)) == 2
                await asyncio.sleep(0.2)
            assert (await engine.get_run(run.id)).stages[0].waiting_for == "signal:go"
            await engine.signal(run.id, "go", {"v": 7})
            info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.COMPLETED and info.output == 7
    assert calls.counts == {"s": 2}  # (the first attempt, then the one the signal resumed)


@pytest.mark.parametrize("bad", [-1, True, 2.5, "100"])
async def test_an_unusable_threshold_is_refused(make_engine: EngineFactory, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="continue_as_new_events"):
        make_engine(Registry([signal_workflow(Calls())]), options={"continue_as_new_events": bad})
