"""Scenarios: signals before and after the wait, idempotency keys, signals of one name queueing
in arrival order, unknown and terminal runs; wait timeouts; stage and run timeouts (S7, S7b,
S8, S9)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine_port import (
    MemorySink,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    StageStatus,
    Workflow,
    WorkflowEngine,
)
from engine_port.errors import (
    EngineError,
    RunNotActiveError,
    RunNotFoundError,
    SignalQueueFullError,
    StepTimeoutError,
    UnknownSignalError,
)

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._models import Num
from ._trace import check_golden, normalise

__all__ = ["SignalContract", "SignalGateContract", "TimeoutContract"]


def waiter(
    log: ExecutionLog, timeout: timedelta | None = None, retry: Retry | None = None
) -> Workflow[Num]:
    wf = Workflow(unique_id("sig"), input=Num)

    def x() -> int:
        log.hit("x")
        return 1

    @wf.stage(retry=retry or Retry(max_attempts=1))
    async def w(ctx: StageContext[Num]) -> dict[str, Any]:
        log.hit("w")
        await ctx.step.run("x", x)
        payload = await ctx.step.wait_for_signal("go", timeout=timeout)
        return {"got": payload}

    return wf


class SignalContract:
    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s7_signal_after_wait(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = waiter(log)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            events = await wait_for_events(sink, run.id, "stage.suspended")
            assert events[-1].data["waiting_for"] == "signal:go"
            current = await engine.get_run(run.id)
            assert current.status == RunStatus.SUSPENDED
            assert current.stage("w").waiting_for == "signal:go"
            first = await engine.signal(run.id, "go", {"n": 1}, idempotency_key="k1")
            assert (first.delivered, first.already_completed) == (True, False)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
            with pytest.raises(RunNotActiveError):
                await engine.signal(run.id, "go", {"n": 2})
            with pytest.raises(RunNotActiveError):  # terminal wins over a repeated key
                await engine.signal(run.id, "go", {"n": 1}, idempotency_key="k1")
        assert info.output == {"got": {"n": 1}}
        assert log.counts() == {"w": 2, "x": 1}
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "w", 1],
            ["stage.suspended", "w", "signal", "signal:go"],
            ["stage.completed", "w", 1],
            ["run.completed"],
        ]
        check_golden("s7_signal_after_wait", {"trace": trace, "counts": log.counts()})

    async def test_s7_second_signal_while_active(self, harness: Harness) -> None:
        """A repeated idempotency key is not queued again; a second signal without one is
        queued for a later wait (here none comes)."""
        wf = Workflow(unique_id("sig2"), input=Num)

        @wf.stage
        async def w(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        @wf.stage(after=[w])
        async def hold(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("finish")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            first = await engine.signal(run.id, "go", 1, idempotency_key="k1")
            assert (first.delivered, first.already_completed) == (True, False)
            again = await engine.signal(run.id, "go", 1, idempotency_key="k1")
            assert (again.delivered, again.already_completed) == (False, True)
            await wait_for_events(sink, run.id, "stage.completed")
            again = await engine.signal(run.id, "go", "other", idempotency_key="k1")
            assert (again.delivered, again.already_completed) == (False, True)
            second = await engine.signal(run.id, "go", 2)
            assert (second.delivered, second.already_completed) == (False, False)
            third = await engine.signal(run.id, "go", 2)  # no key: simply queued again
            assert (third.delivered, third.already_completed) == (False, False)
            for bad in ("", "k" * 301):
                with pytest.raises(EngineError, match="idempotency_key"):
                    await engine.signal(run.id, "finish", 0, idempotency_key=bad)
            await engine.signal(run.id, "finish", 3)
            info = await engine.wait(run.id, timeout=60)
        assert info.output == 3 and info.stage("w").output == 1

    async def test_s7_repeated_key_before_any_stage_ended(self, harness: Harness) -> None:
        """A sender's retry of a keyed signal is reported ``already_completed`` however early
        it comes: here right after the start, while the run's first stage (a ``local=True``
        one, which on Temporal runs before the run publishes any state) still runs, so no
        stage waits yet. (The stage does not wait for the test: on Temporal a local stage
        holds the run's workflow task, and a signal is answered once it returns: there it
        returns after 1.5 s; elsewhere once both signals were sent, however slow the host.)"""
        wf = Workflow(unique_id("sigk"), input=Num)
        sent_both = asyncio.Event()

        @wf.stage(local=True)
        async def first(ctx: StageContext[Num]) -> int:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sent_both.wait(), 1.5)
            return 1

        @wf.stage(after=[first])
        async def w(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            sent = await engine.signal(run.id, "go", {"n": 1}, idempotency_key="k1")
            again = await engine.signal(run.id, "go", {"n": 1}, idempotency_key="k1")
            sent_both.set()
            info = await engine.wait(run.id, timeout=60)
        assert (sent.delivered, sent.already_completed) == (False, False)
        assert (again.delivered, again.already_completed) == (False, True)
        assert info.output == {"n": 1}

    async def test_a_compensating_run_takes_no_signal(self, harness: Harness) -> None:
        """Once a run rolls back (here: cancelled, its compensation still running) a signal
        raises RunNotActiveError naming the status, with or without an idempotency key."""
        wf = Workflow(unique_id("sigc"), input=Num)
        undoing, release = asyncio.Event(), asyncio.Event()

        @wf.stage
        async def reserve(ctx: StageContext[Num]) -> str:
            return "held"

        @reserve.compensation
        async def unreserve(ctx: StageContext[Num], output: str) -> None:
            undoing.set()
            await asyncio.wait_for(release.wait(), 60)

        @wf.stage(after=[reserve])
        async def w(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            cancelling = asyncio.ensure_future(engine.cancel(run.id))
            try:
                await asyncio.wait_for(undoing.wait(), 60)
                with pytest.raises(RunNotActiveError, match="compensating"):
                    await engine.signal(run.id, "go", 1)
                with pytest.raises(RunNotActiveError, match="compensating"):
                    await engine.signal(run.id, "go", 1, idempotency_key="k1")
                assert (await engine.get_run(run.id)).status == RunStatus.COMPENSATING
            finally:
                release.set()
            await cancelling
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.CANCELLED

    async def test_s7b_signals_of_one_name_queue_across_stages(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """a -> b each wait for "go"; both signals arrive before a waits: a takes the first,
        b the second, neither suspends."""
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s7b"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> Any:
            log.hit("a")
            return await ctx.step.wait_for_signal("go")

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> Any:
            log.hit("b")
            return await ctx.step.wait_for_signal("go")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine:
            run = await engine.start(wf.id, {})
            one = await engine.signal(run.id, "go", {"n": 1})
            two = await engine.signal(run.id, "go", {"n": 2})
            assert [(r.delivered, r.already_completed) for r in (one, two)] == [(False, False)] * 2
            async with engine.worker():
                info = await engine.wait(run.id, timeout=60)
                events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED
        assert (info.stage("a").output, info.stage("b").output) == ({"n": 1}, {"n": 2})
        assert info.output == {"n": 2}
        assert log.counts() == {"a": 1, "b": 1}
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "a", 1],
            ["stage.completed", "a", 1],
            ["stage.started", "b", 1],
            ["stage.completed", "b", 1],
            ["run.completed"],
        ]
        check_golden("s7b_queue_across_stages", {"trace": trace, "counts": log.counts()})

    @pytest.mark.parametrize("concurrent", [False, True], ids=["sequential", "concurrent"])
    async def test_s7b_twenty_signals_to_one_waiting_run(
        self, harness: Harness, concurrent: bool
    ) -> None:
        """Twenty signals "go" to a stage waiting for "go": exactly one is delivered, the
        others are buffered; the stage then waits 19 more times (step keys go#2..go#20) and
        receives all twenty, in arrival order."""
        wf = Workflow(unique_id("s7b20"), input=Num)

        @wf.stage
        async def w(ctx: StageContext[Num]) -> list[Any]:
            first = await ctx.step.wait_for_signal("go")
            await ctx.step.wait_for_signal("release")  # only then take the rest
            rest = [await ctx.step.wait_for_signal("go") for _ in range(19)]
            return [first, *rest]

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            if concurrent:
                results = await asyncio.gather(
                    *(engine.signal(run.id, "go", {"i": i}) for i in range(20))
                )
            else:
                results = [await engine.signal(run.id, "go", {"i": i}) for i in range(20)]
            delivered = [i for i, r in enumerate(results) if r.delivered]
            assert len(delivered) == 1, results
            assert not any(r.already_completed for r in results)
            await eventually(
                lambda: [
                    e
                    for e in sink.for_run(run.id)
                    if e.type == "stage.suspended" and e.data["waiting_for"] == "signal:release"
                ],
                what="w waiting for release",
            )
            assert (await engine.signal(run.id, "release", None)).delivered
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED
        got = [p["i"] for p in info.output]
        assert sorted(got) == list(range(20))  # nothing dropped, nothing twice
        assert got[0] == delivered[0]  # the delivered one went to the waiting step
        if not concurrent:
            assert got == list(range(20)) and delivered == [0]  # arrival order
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "w", 1],
            ["stage.suspended", "w", "signal", "signal:go"],
            ["stage.suspended", "w", "signal", "signal:release"],
            ["stage.completed", "w", 1],
            ["run.completed"],
        ]
        if not concurrent:
            check_golden("s7b_twenty_signals", {"trace": trace, "output": got})

    async def test_parallel_stages_take_distinct_signals(self, harness: Harness) -> None:
        """Two stages of one group wait for "go" and two signals are buffered: each stage takes
        its own (which one gets which is a race), none is taken twice."""
        wf = Workflow(unique_id("sigpar"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        @wf.stage
        async def b(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        async with harness.engine(Registry([wf]), MemorySink()) as engine:
            run = await engine.start(wf.id, {})
            for n in (1, 2):
                assert not (await engine.signal(run.id, "go", n)).delivered
            async with engine.worker():
                info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED
        assert sorted([info.stage("a").output, info.stage("b").output]) == [1, 2]

    async def test_s8_signal_before_wait(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = waiter(log)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine:
            run = await engine.start(wf.id, {})
            result = await engine.signal(run.id, "go", {"early": True})
            assert (result.delivered, result.already_completed) == (False, False)  # buffered
            async with engine.worker():
                info = await engine.wait(run.id, timeout=60)
                events = await wait_for_events(sink, run.id, "run.completed")
        assert info.output == {"got": {"early": True}}
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "w", 1],
            ["stage.completed", "w", 1],
            ["run.completed"],
        ]
        check_golden("s8_signal_before_wait", {"trace": trace})

    async def test_s8b_signal_while_stage_body_runs(self, harness: Harness, tmp_path: Path) -> None:
        """The signal arrives after the stage started, while its body runs and before it
        reaches the wait (the body is held at a barrier in this test process): the wait takes
        the buffered signal at once, the stage never suspends and its body runs once."""
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s8b"), input=Num)
        released = {"open": False}

        def x() -> int:
            log.hit("x")
            return 1

        @wf.stage(retry=Retry(max_attempts=1))
        async def w(ctx: StageContext[Num]) -> dict[str, Any]:
            log.hit("w")
            await ctx.step.run("x", x)
            await eventually(lambda: released["open"], timeout=60, what="the test's barrier")
            payload = await ctx.step.wait_for_signal("go")
            return {"got": payload}

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await eventually(lambda: log.count("x") == 1, timeout=60, what="w at the barrier")
            result = await engine.signal(run.id, "go", {"during": True})
            assert (result.delivered, result.already_completed) == (False, False)  # buffered
            released["open"] = True
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED
        assert info.output == {"got": {"during": True}}
        assert log.counts() == {"w": 1, "x": 1}
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "w", 1],
            ["stage.completed", "w", 1],
            ["run.completed"],
        ]
        check_golden("s8b_signal_during_stage", {"trace": trace, "counts": log.counts()})

    async def test_a_full_signal_queue_refuses_past_the_bound(self, harness: Harness) -> None:
        """``max_pending_signals`` bounds the run's unconsumed signals of every name: past it
        ``signal`` raises SignalQueueFullError (typed), even for a name a step waits for; a
        sender's retry of a queued signal's key is still already_completed."""
        wf = Workflow(unique_id("bound"), input=Num)

        @wf.stage(signals=["go", "x"], retry=Retry(max_attempts=1))
        async def w(ctx: StageContext[Num]) -> list[Any]:
            await ctx.step.wait_for_signal("go")
            return [await ctx.step.wait_for_signal("x") for _ in range(2)]

        sink = MemorySink()
        registry = Registry([wf])
        engine_cm = harness.engine(registry, sink, max_pending_signals=2)
        async with engine_cm as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            for i in range(2):
                res = await engine.signal(run.id, "x", i, idempotency_key=f"k{i}")
                assert (res.delivered, res.already_completed) == (False, False), res
            with pytest.raises(SignalQueueFullError) as caught:
                await engine.signal(run.id, "x", 9, idempotency_key="k9")
            assert isinstance(caught.value, EngineError)
            again = await engine.signal(run.id, "x", 0, idempotency_key="k0")
            assert (again.delivered, again.already_completed) == (False, True), again
            with pytest.raises(SignalQueueFullError):
                await engine.signal(run.id, "go", None)  # a waiting step's name counts too
            info = await engine.cancel(run.id)
            assert info.status == RunStatus.CANCELLED, info

    async def test_a_signal_a_wait_took_leaves_the_bound(self, harness: Harness) -> None:
        """A signal a suspended wait took is consumed at once: it no longer counts toward
        ``max_pending_signals``, while the attempt that took it still runs, and after that
        attempt failed (its wait is journaled: the retry gets the same signal, none is taken
        twice, none goes back to the queue). Bound 1: the next signal is queued, the one
        after it refused."""
        wf = Workflow(unique_id("bound-took"), input=Num)
        took, release = asyncio.Event(), asyncio.Event()

        @wf.stage(signals=["go", "x"], retry=Retry(max_attempts=2, initial_interval=timedelta(0)))
        async def w(ctx: StageContext[Num]) -> list[Any]:
            go = await ctx.step.wait_for_signal("go")
            if ctx.attempt == 1:
                took.set()
                await asyncio.wait_for(release.wait(), 60)
                raise RuntimeError("the attempt that took go fails")
            return [go, await ctx.step.wait_for_signal("x")]

        sink = MemorySink()
        async with (
            harness.engine(Registry([wf]), sink, max_pending_signals=1) as engine,
            engine.worker(),
        ):
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            res = await engine.signal(run.id, "go", "g")
            assert res.delivered, res
            await asyncio.wait_for(took.wait(), 30)
            res = await engine.signal(run.id, "x", "x1")  # (go is not counted any more)
            assert (res.delivered, res.already_completed) == (False, False), res
            with pytest.raises(SignalQueueFullError):
                await engine.signal(run.id, "x", "x2")
            release.set()
            info = await engine.wait(run.id, timeout=60)
            assert info.status == RunStatus.COMPLETED, info
            assert info.output == ["g", "x1"]
            events = await wait_for_events(sink, run.id, "run.completed")
            failed = [e for e in events if e.type == "stage.failed"]
            assert len(failed) == 1, failed

    async def test_signals_before_any_worker_are_judged_like_later_ones(
        self, harness: Harness
    ) -> None:
        """Signals sent to a run no worker has picked up yet (pending) get the answers of any
        other time: buffered, a sender's retry of a key already_completed (also at the
        bound), and past ``max_pending_signals`` SignalQueueFullError, typed and at once (no
        worker needed). Once a worker runs, the stage takes exactly the signals queued, so
        the run never held more than its bound. (Temporal: the run's history holds them
        before its first workflow task, which judges them as the engine answered.)"""
        wf = _three_signals(unique_id("bound-early"))
        sent: list[tuple[str, str | None]] = [
            ("a", "ka"),
            ("b", None),
            ("a", "ka"),  # a sender's retry
            ("c", None),  # the third: at the bound
            ("d", None),
            ("e", "ke"),
            ("a", "ka"),  # a retry at the bound is still answered
        ]
        want: list[Any] = [(0, 0), (0, 0), (0, 1), (0, 0), "full", "full", (0, 1)]
        async with harness.engine(Registry([wf]), MemorySink(), max_pending_signals=3) as engine:
            run = await engine.start(wf.id, {})
            got = await _answers(engine, run.id, sent)
            assert got == want, list(zip(sent, got, strict=True))
            async with engine.worker():
                info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED, info
        assert info.output == ["a", "b", "c"]

    async def test_signals_while_no_worker_runs_the_run_are_judged_like_any_other(
        self, harness: Harness
    ) -> None:
        """A run that waits for its second signal when its worker stops (a deploy, an outage)
        answers the signals sent meanwhile as at any other time: a sender's retry of a key it
        took already_completed, the next one delivered to the waiting stage, the one after
        buffered, one past ``max_pending_signals`` SignalQueueFullError (the delivered one counts
        until the stage, which runs again only with a worker, takes it). (Temporal: no worker
        can be asked; once ``signal_timeout`` passed, the run's next workflow task, which its
        history holds, is run by the engine to judge the signal; before, the answer was read
        from the run's last state, which knows no keys or bound.)"""
        wf = _three_signals(unique_id("bound-idle"))
        sink = MemorySink()
        sent: list[tuple[str, str | None]] = [("a", "ka"), ("b", None), ("c", None), ("d", None)]
        async with harness.engine(Registry([wf]), sink, max_pending_signals=2) as engine:
            run = await engine.start(wf.id, {})
            async with engine.worker():
                await wait_for_events(sink, run.id, "stage.suspended")
                res = await engine.signal(run.id, "go", "a", idempotency_key="ka")
                assert (res.delivered, res.already_completed) == (True, False), res
                await eventually(
                    lambda: [e.type for e in sink.for_run(run.id)].count("stage.suspended") == 2
                )
            got = await _answers(engine, run.id, sent)
            assert got == [(0, 1), (1, 0), (0, 0), "full"], list(zip(sent, got, strict=True))
            async with engine.worker():
                info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED, info
        assert info.output == ["a", "b", "c"]

    async def test_a_signal_that_wakes_a_stage_while_no_worker_runs_reads_the_run_running(
        self, harness: Harness
    ) -> None:
        """A signal a waiting stage takes while no worker runs the run (a deploy, an outage)
        makes the run `running` at once, its stage still `suspended` on the signal until a
        worker resumes it; a sender's retry of a key the stage took wakes nothing. (Temporal:
        only the run writes its state, so `get_run` judges the signals sent since its last
        workflow task by running its next one on the history, as `signal()` does; before, it
        read `suspended` until a worker took that task.)"""
        wf = _three_signals(unique_id("idle-read"))
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine:
            run = await engine.start(wf.id, {})
            async with engine.worker():
                await wait_for_events(sink, run.id, "stage.suspended")
                await engine.signal(run.id, "go", "a", idempotency_key="ka")
                await eventually(
                    lambda: [e.type for e in sink.for_run(run.id)].count("stage.suspended") == 2
                )
            assert (await engine.get_run(run.id)).status == RunStatus.SUSPENDED
            assert await _answers(engine, run.id, [("a", "ka")]) == [(0, 1)]
            assert (await engine.get_run(run.id)).status == RunStatus.SUSPENDED
            assert await _answers(engine, run.id, [("b", None)]) == [(1, 0)]
            woken = await engine.get_run(run.id)
            assert woken.status == RunStatus.RUNNING, woken
            lazy = getattr(engine, "get_run_lazy", None)  # (what `wfe show` and the web view read)
            if lazy is not None:
                assert (await lazy(run.id))[0].status == RunStatus.RUNNING
            stage = woken.stage("w")
            assert (stage.status, stage.waiting_for) == (StageStatus.SUSPENDED, "signal:go"), stage
            async with engine.worker():
                await eventually(
                    lambda: [e.type for e in sink.for_run(run.id)].count("stage.suspended") == 3
                )
                await engine.signal(run.id, "go", "c")
                info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED, info
        assert info.output == ["a", "b", "c"]

    async def test_signal_unknown_run(self, harness: Harness, tmp_path: Path) -> None:
        async with harness.engine(
            Registry([waiter(ExecutionLog(tmp_path / "log"))]), MemorySink()
        ) as engine:
            with pytest.raises(RunNotFoundError):
                await engine.signal("no-such-run", "go", {})
            with pytest.raises(RunNotFoundError):
                await engine.get_run("no-such-run")
            with pytest.raises(RunNotFoundError):
                await engine.cancel("no-such-run")

    async def test_signal_name_no_stage_waits_for(self, harness: Harness) -> None:
        """A version whose stages declare their signals refuses any other name, before
        anything is queued; one that declares none takes every name (buffered)."""
        wf = Workflow(unique_id("sig-declared"), input=Num)

        @wf.stage(signals=["go"], retry=Retry(max_attempts=1))
        async def w(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        open_wf = Workflow(unique_id("sig-open"), input=Num)

        @open_wf.stage(retry=Retry(max_attempts=1))
        async def v(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        sink = MemorySink()
        async with harness.engine(Registry([wf, open_wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            with pytest.raises(UnknownSignalError) as refused:
                await engine.signal(run.id, "og", {"n": 1})
            assert refused.value.known == ["go"] and refused.value.name == "og"
            assert "'go'" in str(refused.value)
            assert (await engine.get_run(run.id)).status == RunStatus.SUSPENDED
            await engine.signal(run.id, "go", {"n": 2})
            info = await engine.wait(run.id, timeout=60)
            assert info.output == {"n": 2}  # the refused payload was never queued

            other = await engine.start(open_wf.id, {})
            await wait_for_events(sink, other.id, "stage.suspended")
            extra = await engine.signal(other.id, "anything", {"n": 3})
            assert extra.delivered is False
            await engine.signal(other.id, "go", {"n": 4})
            assert (await engine.wait(other.id, timeout=60)).output == {"n": 4}

    async def test_s9_wait_timeout(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        retry = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50))
        wf = waiter(log, timeout=timedelta(milliseconds=300), retry=retry)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == StepTimeoutError.__name__
        deadlines = {e.data["until"] for e in events if e.type == "stage.suspended"}
        assert len(deadlines) == 1  # the deadline never slides, across replays and attempts
        assert log.count("x") == 1
        trace = normalise(events, wf.graph())
        assert trace[-4:] == [
            ["stage.failed", "w", 1, "StepTimeoutError", True],
            ["stage.started", "w", 2],
            ["stage.failed", "w", 2, "StepTimeoutError", False],
            ["run.failed", "StepTimeoutError", None],
        ]
        check_golden("s9_wait_timeout", {"trace": trace})

    async def test_wait_timeout_caught(self, harness: Harness) -> None:
        wf = Workflow(unique_id("s9c"), input=Num)

        @wf.stage
        async def w(ctx: StageContext[Num]) -> str:
            try:
                await ctx.step.wait_for_signal("go", timeout=timedelta(milliseconds=100))
            except StepTimeoutError:
                return "gave up"
            return "signalled"

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
        assert info.output == "gave up"

    async def test_wait_for_condition(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("poll"), input=Num)

        def check() -> Any:
            log.hit("check")
            return {"ready": True} if log.count("check") >= 3 else None

        @wf.stage
        async def p(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for("ready", check, interval=0.05, timeout=30)

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
        assert info.output == {"ready": True}
        assert log.count("check") == 3


def gated(
    log: ExecutionLog,
    retry: Retry | None = None,
    fail_once: bool = False,
    local: bool = False,
    timeout: timedelta | None = None,
) -> Workflow[Num]:
    """``first`` waits for ``a``, then ``b`` starts on ``go`` (``after_signal``, waiting at
    most ``timeout``), then ``c`` (``local``: ``b`` and ``c`` are ``local=True``)."""
    wf = Workflow(unique_id("gate"), input=Num)

    @wf.stage(signals=["a"])
    async def first(ctx: StageContext[Num]) -> Any:
        return await ctx.step.wait_for_signal("a")

    @wf.stage(
        after=[first],
        after_signal="go",
        after_signal_timeout=timeout,
        retry=retry or Retry(max_attempts=1),
        local=local,
    )
    async def b(ctx: StageContext[Num]) -> dict[str, Any]:
        log.hit("b")
        payload = await ctx.step.wait_for_signal("go")
        if fail_once and log.counts()["b"] == 1:
            raise RuntimeError("after the gate")
        return {"got": payload, "first": ctx.outputs["first"]}

    @wf.stage(after=[b], local=local)
    async def c(ctx: StageContext[Num]) -> Any:
        return ctx.outputs["b"]

    return wf


async def _steps(engine: Any, run_id: str) -> list[tuple[str, str, bool]]:
    return sorted((s.stage, s.name, s.completed) for s in await engine.steps(run_id))


async def _gate_reached(sink: MemorySink, run_id: str) -> list[Any]:
    """The run's events once stage ``b`` suspended on its gate."""

    def reached() -> list[Any] | None:
        events = sink.for_run(run_id)
        waits = [e for e in events if e.type == "stage.suspended" and e.stage == "b"]
        return events if waits else None

    events: list[Any] = await eventually(reached, what="stage b suspended on signal go")
    return events


class SignalGateContract:
    """A stage declared ``after_signal="go"`` waits for the signal before its body runs, as a
    body that begins with that wait, and journals it as the body's first wait."""

    pytestmark = CONTRACT_MARKS

    @pytest.mark.parametrize("local", [False, True], ids=["activity", "local"])
    async def test_gate_waits_before_the_body(
        self, harness: Harness, tmp_path: Path, local: bool
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = gated(log, local=local)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.signal(run.id, "a", 1)
            events = await _gate_reached(sink, run.id)
            assert events[-1].data["waiting_for"] == "signal:go"
            current = await engine.get_run(run.id)
            assert current.status == RunStatus.SUSPENDED
            assert current.stage("b").waiting_for == "signal:go"
            assert log.counts().get("b", 0) == 0  # no attempt ran before the signal
            assert await _steps(engine, run.id) == [("first", "a", True)]  # nothing journaled
            sent = await engine.signal(run.id, "go", {"ok": True})
            assert (sent.delivered, sent.already_completed) == (True, False)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
            assert await _steps(engine, run.id) == [("b", "go", True), ("first", "a", True)]
        assert info.output == {"got": {"ok": True}, "first": 1}
        assert log.counts() == {"b": 1}
        trace = normalise(events, wf.graph())
        # (whether ``first`` found its signal buffered or waited for it is a race)
        assert [t for t in trace if t[:2] != ["stage.suspended", "first"]] == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "first", 1],
            ["stage.completed", "first", 1],
            ["stage.started", "b", 1],
            ["stage.suspended", "b", "signal", "signal:go"],
            ["stage.completed", "b", 1],
            ["stage.started", "c", 1],
            ["stage.completed", "c", 1],
            ["run.completed"],
        ]

    async def test_gate_signal_already_there(self, harness: Harness, tmp_path: Path) -> None:
        """A signal sent before the stage was ready is taken at its start: no suspension."""
        log = ExecutionLog(tmp_path / "log")
        wf = gated(log)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            await engine.signal(run.id, "go", "early")
            await engine.signal(run.id, "a", 2)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.output == {"got": "early", "first": 2}
        assert log.counts() == {"b": 1}
        trace = normalise(events, wf.graph())
        assert ["stage.suspended", "b", "signal", "signal:go"] not in trace
        assert trace[-5:-2] == [
            ["stage.started", "b", 1],
            ["stage.completed", "b", 1],
            ["stage.started", "c", 1],
        ]

    async def test_gate_signal_sent_while_a_local_stage_runs(self, harness: Harness) -> None:
        """A signal sent while the ``local=True`` stage before the gate runs is there when
        the gated stage starts (on Temporal it reaches the run only once the local stage's
        workflow task ended, the task that starts the gated stage: found by the fuzzer)."""
        wf = Workflow(unique_id("gate-local"), input=Num)

        @wf.stage(local=True)
        async def a(ctx: StageContext[Num]) -> int:
            await asyncio.sleep(0.5)  # (the signal is sent meanwhile)
            return 1

        @wf.stage(after=[a], after_signal="go")
        async def b(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.signal(run.id, "go", "early")
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.output == "early"
        assert normalise(events, wf.graph()) == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "a", 1],
            ["stage.completed", "a", 1],
            ["stage.started", "b", 1],
            ["stage.completed", "b", 1],
            ["run.completed"],
        ]

    async def test_gate_retry_keeps_the_signal(self, harness: Harness, tmp_path: Path) -> None:
        """The signal the gate took is journaled: a retry of the stage starts at once with
        the same payload, it does not wait for another signal."""
        log = ExecutionLog(tmp_path / "log")
        wf = gated(log, retry=Retry(max_attempts=2, initial_interval=timedelta(0)), fail_once=True)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.signal(run.id, "a", 3)
            await _gate_reached(sink, run.id)
            await engine.signal(run.id, "go", "once")
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.output == {"got": "once", "first": 3}
        assert log.counts() == {"b": 2}
        trace = normalise(events, wf.graph())
        assert trace.count(["stage.suspended", "b", "signal", "signal:go"]) == 1

    async def test_gate_timeout_fails_the_stage_without_its_body(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """``after_signal_timeout``: no signal by the deadline, the attempt fails with
        StepTimeoutError and its body never runs; the timeout is journaled, so the retry
        fails at once (as an uncaught ``wait_for_signal`` timeout), the deadline never
        slides."""
        log = ExecutionLog(tmp_path / "log")
        retry = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50))
        wf = gated(log, retry=retry, timeout=timedelta(milliseconds=400))
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.signal(run.id, "a", 1)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
            assert await _steps(engine, run.id) == [("b", "go", True), ("first", "a", True)]
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == StepTimeoutError.__name__
        assert "'go'" in info.error.message
        assert log.counts().get("b", 0) == 0  # the body never ran
        gate_waits = [e for e in events if e.type == "stage.suspended" and e.stage == "b"]
        assert len(gate_waits) == 1 and gate_waits[0].data["until"] is not None
        trace = normalise(events, wf.graph())
        assert trace[-6:] == [
            ["stage.started", "b", 1],
            ["stage.suspended", "b", "signal", "signal:go"],
            ["stage.failed", "b", 1, "StepTimeoutError", True],
            ["stage.started", "b", 2],
            ["stage.failed", "b", 2, "StepTimeoutError", False],
            ["run.failed", "StepTimeoutError", None],
        ]

    async def test_gate_signal_within_its_timeout(self, harness: Harness, tmp_path: Path) -> None:
        """A signal before the gate's deadline passes it: the body runs with its payload."""
        log = ExecutionLog(tmp_path / "log")
        wf = gated(log, timeout=timedelta(seconds=60))
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.signal(run.id, "a", 4)
            events = await _gate_reached(sink, run.id)
            assert events[-1].data["until"] is not None
            assert (await engine.get_run(run.id)).stage("b").wake_at is not None
            sent = await engine.signal(run.id, "go", "in time")
            assert sent.delivered
            info = await engine.wait(run.id, timeout=60)
        assert info.output == {"got": "in time", "first": 4}
        assert log.counts() == {"b": 1}


class TimeoutContract:
    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_stage_timeout(self, harness: Harness, tmp_path: Path) -> None:
        if not harness.capabilities.stage_timeout:
            pytest.skip("driver lacks capability stage_timeout")
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("st"), input=Num)

        @wf.stage(
            timeout=timedelta(milliseconds=300),
            retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=10)),
        )
        async def slow(ctx: StageContext[Num]) -> int:
            log.hit("slow")
            if ctx.attempt == 1:
                await asyncio.sleep(10)
            return ctx.attempt

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == 2
        assert log.count("slow") == 2

    async def test_run_timeout(self, harness: Harness, tmp_path: Path) -> None:
        if not harness.capabilities.run_timeout:
            pytest.skip("driver lacks capability run_timeout")
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("rt"), input=Num, timeout=timedelta(milliseconds=500))

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            return 1

        @wf.stage(after=[a])
        async def hang(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("never")

        @a.compensation
        async def undo(ctx: StageContext[Num], out: int) -> None:
            log.hit("undo-a")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "RunTimeoutError"
        # the same message on every driver (native said "exceeded its run timeout")
        assert info.error.message == (
            f"run {run.id!r} ran longer than its timeout of 0.5s; raise the workflow "
            "timeout= or speed it up"
        )
        assert log.count("undo-a") == 1
        assert [e.type for e in events[-3:]] == [
            "stage.cancelled",
            "stage.compensated",
            "run.failed",
        ]


def _three_signals(workflow_id: str) -> Workflow[Num]:
    """One stage that takes three ``go`` signals, then a fourth if one comes within 1 s."""
    wf = Workflow(workflow_id, input=Num)

    @wf.stage(signals=["go"], retry=Retry(max_attempts=1))
    async def w(ctx: StageContext[Num]) -> list[Any]:
        got = [await ctx.step.wait_for_signal("go") for _ in range(3)]
        with contextlib.suppress(StepTimeoutError):
            got.append(await ctx.step.wait_for_signal("go", timeout=timedelta(seconds=1)))
        return got

    return wf


async def _answers(
    engine: WorkflowEngine, run_id: str, sent: list[tuple[str, str | None]]
) -> list[Any]:
    """The answers to ``go`` signals ``sent`` one after the other (value, idempotency key):
    ``(delivered, already_completed)`` as 0/1, or ``"full"`` (SignalQueueFullError)."""
    got: list[Any] = []
    for value, key in sent:
        try:
            res = await asyncio.wait_for(
                engine.signal(run_id, "go", value, idempotency_key=key), 60
            )
        except SignalQueueFullError as exc:
            assert isinstance(exc, EngineError)
            got.append("full")
        else:
            got.append((int(res.delivered), int(res.already_completed)))
    return got
