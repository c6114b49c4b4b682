"""Scenarios: time at its edges (DESIGN §5: sleeps, waits and timeouts behave the same on every
driver, whatever the durations).

A ``wait_for`` with a tiny interval polls at most once per suspension (never a busy loop in
the body) and one whose interval is longer than its timeout gives up at the timeout; an
interval of 0 is refused with a readable error. Sleeps of 0 and of 1 ms end. A stage timeout
shorter than a step it journals keeps the step: the next attempt replays it. A sync body that
blocks past its timeout fails the attempt and the worker goes on with other runs. A run
timeout fails the run whether its stage sleeps or waits for a signal. A signal sent at the
moment its wait times out is either taken by the wait or kept for the next one, never lost.
Every trace has contiguous sequence numbers and one ``stage.started`` per attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine_port import Event, MemorySink, Registry, Retry, RunStatus, StageContext, Workflow
from engine_port.errors import StepTimeoutError

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, unique_id, wait_for_events
from ._models import Num
from ._trace import normalise

__all__ = ["TimingContract"]

ONCE = Retry(max_attempts=1, initial_interval=timedelta(0))
TWICE = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=10))


def _checked(events: list[Event], wf: Workflow[Any]) -> list[list[Any]]:
    """The run's trace, after checking its sequence has no gap and each attempt of a stage
    started once."""
    trace = normalise(events, wf.graph())  # raises on a gap or a duplicate sequence number
    started = Counter(tuple(t) for t in trace if t[0] == "stage.started")
    assert all(n == 1 for n in started.values()), f"an attempt started twice: {trace}"
    return trace


async def _ended(
    harness: Harness, wf: Workflow[Any], timeout: float = 60
) -> tuple[Any, list[list[Any]]]:
    sink = MemorySink()
    async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=timeout)
        last = "run.completed" if info.status == RunStatus.COMPLETED else "run.failed"
        events = await wait_for_events(sink, run.id, last)
    return info, _checked(events, wf)


class TimingContract:
    """Sleeps, polls and timeouts at their edges behave the same on every driver."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_a_tiny_poll_interval_polls_once_per_suspension(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("tiny-poll"), input=Num)
        ready_at: list[float] = []

        def check() -> Any:
            log.hit("check")
            if not ready_at:
                ready_at.append(time.monotonic() + 0.5)
            return "ready" if time.monotonic() >= ready_at[0] else None

        @wf.stage(retry=ONCE)
        async def p(ctx: StageContext[Num]) -> Any:
            log.hit("body")
            return await ctx.step.wait_for("ready", check, interval=0.001, timeout=30)

        info, trace = await _ended(harness, wf)
        assert info.status == RunStatus.COMPLETED and info.output == "ready", info.error
        suspensions = sum(1 for t in trace if t[0] == "stage.suspended")
        # each poll that finds nothing suspends the stage, and the body replays on each wake
        assert log.count("check") == suspensions + 1, (log.counts(), suspensions)
        assert log.count("body") == suspensions + 1, (log.counts(), suspensions)

    async def test_a_poll_interval_of_zero_is_refused(self, harness: Harness) -> None:
        wf = Workflow(unique_id("zero-poll"), input=Num)

        @wf.stage(retry=TWICE)
        async def p(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for("ready", lambda: None, interval=0, timeout=1)

        info, trace = await _ended(harness, wf)
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "StepError"
        assert "interval must be a timedelta or more than 0 seconds" in info.error.message
        assert trace[2:] == [  # never retried: a retry would refuse it again
            ["stage.started", "p", 1],
            ["stage.failed", "p", 1, "StepError", False],
            ["run.failed", "StepError", None],
        ]

    async def test_a_poll_interval_longer_than_its_timeout_gives_up_at_the_timeout(
        self, harness: Harness
    ) -> None:
        wf = Workflow(unique_id("long-poll"), input=Num)

        @wf.stage(retry=ONCE)
        async def p(ctx: StageContext[Num]) -> Any:
            try:
                await ctx.step.wait_for("ready", lambda: None, interval=3600, timeout=2.0)
            except StepTimeoutError as exc:
                return str(exc)
            return "met"

        t0 = time.monotonic()
        info, trace = await _ended(harness, wf, timeout=30)
        assert info.status == RunStatus.COMPLETED, info.error
        assert "condition 'ready' was not met before" in info.output
        assert time.monotonic() - t0 < 20
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "p", 1],
            ["stage.suspended", "p", "poll", "poll:ready"],
            ["stage.completed", "p", 1],
            ["run.completed"],
        ]

    async def test_sleeps_of_zero_and_one_millisecond_end(self, harness: Harness) -> None:
        wf = Workflow(unique_id("short-sleep"), input=Num)

        @wf.stage(retry=ONCE)
        async def s(ctx: StageContext[Num]) -> str:
            await ctx.step.sleep("zero", 0)
            await ctx.step.sleep("zero-td", timedelta(0))
            await ctx.step.sleep("one-ms", timedelta(milliseconds=1))
            return "woke"

        info, trace = await _ended(harness, wf, timeout=30)
        assert info.status == RunStatus.COMPLETED and info.output == "woke", info.error
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "s", 1],
            ["stage.suspended", "s", "sleep", "sleep:one-ms"],
            ["stage.completed", "s", 1],
            ["run.completed"],
        ]

    async def test_a_stage_timeout_keeps_the_steps_its_attempt_journaled(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        if not harness.capabilities.stage_timeout:
            pytest.skip("driver lacks capability stage_timeout")
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("timeout-step"), input=Num)

        def x() -> int:
            log.hit("x")
            return 41

        @wf.stage(timeout=timedelta(seconds=1), retry=TWICE)
        async def slow(ctx: StageContext[Num]) -> int:
            log.hit("slow")
            v: int = await ctx.step.run("x", x)
            if ctx.attempt == 1:
                await asyncio.sleep(30)
            return v + ctx.attempt - 1

        info, trace = await _ended(harness, wf)
        assert info.status == RunStatus.COMPLETED and info.output == 42, info.error
        assert log.count("slow") == 2
        assert log.count("x") == 1  # attempt 2 replayed the journaled step
        assert trace[2:5] == [
            ["stage.started", "slow", 1],
            ["stage.failed", "slow", 1, "StageTimeoutError", True],
            ["stage.started", "slow", 2],
        ]

    async def test_a_sync_body_blocking_past_its_timeout_fails_the_attempt(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        if not harness.capabilities.stage_timeout:
            pytest.skip("driver lacks capability stage_timeout")
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("sync-block"), input=Num)
        other = Workflow(unique_id("after-block"), input=Num)

        @wf.stage(timeout=timedelta(seconds=1), retry=TWICE)
        def blocks(ctx: StageContext[Num]) -> int:
            log.hit(f"blocks-{ctx.attempt}")
            if ctx.attempt == 1:
                time.sleep(4)
                log.hit("woke")
            return ctx.attempt

        @other.stage(retry=ONCE)
        async def quick(ctx: StageContext[Num]) -> str:
            return "ok"

        sink = MemorySink()
        async with harness.engine(Registry([wf, other]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            after = await engine.wait((await engine.start(other.id, {})).id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        trace = _checked(events, wf)
        assert info.status == RunStatus.COMPLETED and info.output == 2, info.error
        assert trace[2:5] == [
            ["stage.started", "blocks", 1],
            ["stage.failed", "blocks", 1, "StageTimeoutError", True],
            ["stage.started", "blocks", 2],
        ]
        assert after.status == RunStatus.COMPLETED

    async def test_a_run_timeout_fires_while_its_stage_sleeps(self, harness: Harness) -> None:
        if not harness.capabilities.run_timeout:
            pytest.skip("driver lacks capability run_timeout")
        wf = Workflow(unique_id("rt-sleep"), input=Num, timeout=timedelta(milliseconds=500))

        @wf.stage(retry=ONCE)
        async def nap(ctx: StageContext[Num]) -> str:
            await ctx.step.sleep("long", timedelta(hours=1))
            return "woke"

        info, trace = await _ended(harness, wf)
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "RunTimeoutError"
        assert "ran longer than its timeout of 0.5s" in info.error.message
        assert trace[-2:] == [["stage.cancelled", "nap"], ["run.failed", "RunTimeoutError", None]]

    async def test_a_run_timeout_fires_while_a_compensation_runs(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        if not harness.capabilities.run_timeout:
            pytest.skip("driver lacks capability run_timeout")
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("rt-undo"), input=Num, timeout=timedelta(seconds=1))

        @wf.stage(retry=ONCE)
        async def a(ctx: StageContext[Num]) -> int:
            return 1

        @a.compensation
        async def undo(ctx: StageContext[Num], out: int) -> None:
            log.hit("undo-start")
            await asyncio.sleep(2)
            log.hit("undo-end")

        @wf.stage(after=[a], retry=ONCE)
        async def b(ctx: StageContext[Num]) -> int:
            raise ValueError("b broke")

        info, trace = await _ended(harness, wf)
        # the run timeout does not cut a compensation short: the run ends with its own error
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "ValueError"
        assert info.compensation_errors == []
        assert log.counts() == {"undo-start": 1, "undo-end": 1}
        assert trace[-2:] == [["stage.compensated", "a"], ["run.failed", "ValueError", None]]

    async def test_a_signal_at_the_moment_its_wait_times_out_is_never_lost(
        self, harness: Harness
    ) -> None:
        wf = Workflow(unique_id("sig-race"), input=Num)

        @wf.stage(retry=ONCE, signals=["go"])
        async def w(ctx: StageContext[Num]) -> Any:
            try:
                first = await ctx.step.wait_for_signal("go", timeout=timedelta(milliseconds=400))
            except StepTimeoutError:
                first = "timed out"
            try:
                second = await ctx.step.wait_for_signal("go", timeout=timedelta(seconds=3))
            except StepTimeoutError:
                second = "timed out"
            return [first, second]

        offsets = (-0.05, -0.01, 0.0, 0.01, 0.05)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():

            async def race(offset: float) -> Any:
                run = await engine.start(wf.id, {})
                events = await wait_for_events(sink, run.id, "stage.suspended")
                until = datetime.fromisoformat(events[-1].data["until"])
                gap = (until - datetime.now(UTC)).total_seconds() + offset
                await asyncio.sleep(max(0.0, gap))
                sent = await engine.signal(run.id, "go", {"at": offset})
                return sent, await engine.wait(run.id, timeout=60)

            ended = await asyncio.gather(*(race(o) for o in offsets))
        for offset, (sent, info) in zip(offsets, ended, strict=True):
            assert info.status == RunStatus.COMPLETED, (offset, info.error)
            # taken by the wait that was timing out, or kept for the next one: never lost
            assert info.output in ([{"at": offset}, "timed out"], ["timed out", {"at": offset}])
            # (``delivered`` is what the signal saw at its moment, and either way here: the
            # wait may still be suspended past its deadline and take the signal, or be
            # replaying and time out with the signal buffered for the next wait)
            assert sent.already_completed is False

    async def test_a_compensation_that_hangs_is_bounded_by_its_stage_timeout(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        if not harness.capabilities.stage_timeout:
            pytest.skip("driver lacks capability stage_timeout")
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("hung-undo"), input=Num, timeout=timedelta(seconds=1))

        @wf.stage(retry=ONCE, timeout=timedelta(milliseconds=500))
        async def a(ctx: StageContext[Num]) -> int:
            return 1

        @a.compensation
        async def undo(ctx: StageContext[Num], out: int) -> None:
            log.hit("undo")
            await asyncio.sleep(3600)

        @wf.stage(after=[a], retry=ONCE)
        async def b(ctx: StageContext[Num]) -> int:
            raise ValueError("b broke")

        info, trace = await _ended(harness, wf, timeout=30)
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "ValueError"
        assert [e.type for e in info.compensation_errors] == ["StageTimeoutError"]
        assert info.compensation_errors[0].message == (
            "compensation of stage 'a' ran longer than its timeout of 0.5s; raise the stage "
            "timeout=, or make the compensation faster"
        )
        assert log.count("undo") == 1
        # a failed compensation has no event of its own (only compensation_errors)
        assert trace[-2:] == [
            ["stage.failed", "b", 1, "ValueError", False],
            ["run.failed", "ValueError", None],
        ], trace
