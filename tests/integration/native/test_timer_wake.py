"""A worker that records a job due again in the future (a durable sleep, a wait's timeout, a
retry's delay) wakes itself at that time: the stage resumes on time, not at the next poll.
The poll interval here is far longer than each test, so only that wake can resume the run
in time (before it, each of these runs took the 30 s of the poll)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from driver_native import _worker
from driver_native._worker import WorkerHost
from engine_port import FakeClock, Retry, RunStatus, StageContext, Workflow
from engine_port.errors import StepTimeoutError

from . import workflows as w
from .conftest import MakeEngine, eventually

POLL = 30.0  # poll_interval_seconds: no poll comes due while a test runs

timeout_waiter = Workflow("it-timeout-waiter", input=w.Item)


@timeout_waiter.stage
async def wait_briefly(ctx: StageContext[w.Item]) -> str:
    try:
        await ctx.step.wait_for_signal("never", timeout=timedelta(milliseconds=ctx.input.n))
    except StepTimeoutError:
        return "timed out"
    return "signalled"


retried = Workflow("it-retried", input=w.Item)


@retried.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=200)))
async def fails_once(ctx: StageContext[w.Item]) -> int:
    w.COUNTS["fails_once"] += 1
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return ctx.attempt


async def _idle(host: WorkerHost) -> None:
    """The worker loop's first pass (its claim, its first maintenance) is over: what it
    claims next, it claims when woken (a pass that took longer than a sleep on a busy host
    found the stage due without any wake)."""

    async def surveyed() -> bool:
        return bool(host._next_survey)  # (set when the first survey is over)

    await eventually(surveyed, timeout=10)
    await asyncio.sleep(0.05)


def _pending_rings(host: WorkerHost) -> list[Any]:
    """The event loop's timers set by ``host`` and not cancelled."""
    scheduled = getattr(asyncio.get_running_loop(), "_scheduled", [])
    return [
        h for h in scheduled if not h.cancelled() and getattr(h._callback, "__self__", None) is host
    ]


async def test_a_durable_sleep_resumes_at_its_due_time_not_at_the_next_poll(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with engine.worker() as host:
        assert host.poll_interval == POLL
        await _idle(host)
        run = await engine.start(w.napper, {"n": 300})  # ctx.step.sleep("nap", 0.3 s)
        info = await engine.wait(run.id, timeout=10)
        assert info.status == RunStatus.COMPLETED
        assert info.stages[0].output == 300
        stats = host.stats()
    assert w.COUNTS["nap"] == 2  # suspended, then resumed
    assert stats["woken_by_timer"] >= 1
    assert stats["woken_by_poll"] == 0


async def test_a_retry_runs_after_its_delay_not_at_the_next_poll(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(retried, poll_interval_seconds=POLL)
    async with engine.worker() as host:
        await _idle(host)
        run = await engine.start(retried, {})
        info = await engine.wait(run.id, timeout=10)
        assert info.status == RunStatus.COMPLETED
        assert info.stages[0].output == 2
        stats = host.stats()
    assert w.COUNTS["fails_once"] == 2
    assert stats["retrying"] == 1
    assert stats["woken_by_timer"] >= 1
    assert stats["woken_by_poll"] == 0


async def test_a_signal_wait_times_out_on_time(make_engine: MakeEngine) -> None:
    engine = await make_engine(timeout_waiter, poll_interval_seconds=POLL)
    async with engine.worker() as host:
        await _idle(host)
        run = await engine.start(timeout_waiter, {"n": 300})
        info = await engine.wait(run.id, timeout=10)
        assert info.status == RunStatus.COMPLETED
        assert info.stages[0].output == "timed out"
        assert host.stats()["woken_by_timer"] >= 1


async def test_sequential_sleeps_each_resume_by_the_timer(make_engine: MakeEngine) -> None:
    """Several runs in turn: each wake is set again (none is lost after the first; a sleep
    shorter than a pass of the loop may be claimed by the pass after its suspension)."""
    engine = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with engine.worker() as host:
        await _idle(host)
        for n in (50, 1, 120):
            run = await engine.start(w.napper, {"n": n})
            info = await engine.wait(run.id, timeout=10)
            assert info.status == RunStatus.COMPLETED
        stats = host.stats()
    assert stats["woken_by_timer"] >= 1
    assert stats["woken_by_poll"] == 0


async def test_stopping_a_worker_with_a_pending_wake_leaves_nothing_behind(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(w.napper, poll_interval_seconds=POLL)
    host = WorkerHost(engine.kernel)
    async with host:
        run = await engine.start(w.napper, {"n": 3_600_000})  # an hour's sleep

        async def armed() -> bool:
            return bool(_pending_rings(host))

        await eventually(armed, timeout=10)
        assert len(_pending_rings(host)) == 1  # one timer, for the earliest time
        info = await engine.get_run(run.id)
        assert info.stages[0].status == "suspended"
    assert _pending_rings(host) == []
    assert host._timer is None and host._due_times == []
    # a late report (an outcome recorded during the stop) sets nothing
    host._due_at(engine.kernel.now() + 1)
    assert _pending_rings(host) == []
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not [t for t in tasks if host.worker_id in t.get_name()]


async def test_one_timer_for_the_earliest_of_a_bounded_set_of_times(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with engine.worker() as host:
        now = engine.kernel.now()
        kept = _worker._TIMERS_KEPT
        for i in range(kept + 10):  # latest first: each one is the new earliest
            host._due_at(now + 3600 + kept + 10 - i)
        assert len(host._due_times) == kept
        assert host._due_times[0][0] == now + 3601
        assert len(_pending_rings(host)) == 1
        host._due_at(now + 7200 + kept)  # later than all kept: left to the poll
        assert len(host._due_times) == kept and host._due_times[-1][0] < now + 7200
        # a timer that rings before its time by the engine's clock keeps the time
        host._ring()
        assert host._due_times[0][0] == now + 3601
        assert len(_pending_rings(host)) == 1
        # one that comes due wakes the loop and drops it
        before = host.stats()["woken_by_timer"]
        host._due_at(engine.kernel.now() + 0.05)

        async def rang() -> bool:
            return bool(host.stats()["woken_by_timer"] > before)

        await eventually(rang, timeout=10)
        assert host.stats()["woken_by_timer"] == before + 1
        assert host._due_times[0][0] == now + 3601


async def test_a_clock_that_does_not_move_does_not_make_the_timer_spin(
    make_engine: MakeEngine,
) -> None:
    """A timer rings before its time by the engine's clock when that clock is not the event
    loop's: it rings again later, each time twice as late (a test's FakeClock never moves:
    without that it rang every half millisecond for as long as the worker ran)."""
    engine = await make_engine(w.napper, clock=FakeClock(), poll_interval_seconds=POLL)
    async with engine.worker() as host:
        rings = 0
        ring = host._ring

        def counted() -> None:
            nonlocal rings
            rings += 1
            ring()

        host._ring = counted  # type: ignore[method-assign]
        host._due_at(engine.kernel.now() + 0.0001)
        await asyncio.sleep(0.5)
        assert [at for at, _ in host._due_times] == [engine.kernel.now() + 0.0001]  # not due
        assert 1 <= rings < 40  # (~10; at every 0.5 ms it was ~1000)
        assert len(_pending_rings(host)) <= 1


async def test_a_time_the_last_claim_looked_past_wakes_nobody(make_engine: MakeEngine) -> None:
    """A due time reported before a claim looked, and due when it looked, was that claim's
    to find: its ring wakes nobody (no second claim for a job already running). One reported
    after the look, or due after it, wakes the loop."""
    engine = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with engine.worker() as host:
        await _idle(host)
        now = engine.kernel.now()
        host._due_at(now - 1)  # (the ring is set at once)
        host._looked = (now, host._reports)
        before = host.stats()["woken_by_timer"]
        host._ring()
        assert host._due_times == [] and host.stats()["woken_by_timer"] == before
        host._due_at(now - 1)  # reported after the look
        host._ring()
        assert host._due_times == [] and host.stats()["woken_by_timer"] == before + 1
