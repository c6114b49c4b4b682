"""A worker that starts (or restarts) while runs of the database sleep wakes at their due
time, not at its next poll: its look for work (the same read as before) tells it the
earliest time a job it would claim comes due, whoever recorded it (a worker that stopped, a
deploy, another process). The poll interval here is far longer than each test, so only that
wake can resume the run in time (before it, a run whose worker stopped during its sleep
resumed at the new worker's first poll, 30 s later)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import NativeEngine, _jobs, _kernel
from driver_native._schema import jobs
from driver_native._worker import WorkerHost
from engine_port import RunStatus
from engine_port.driver import version_key

from . import workflows as w
from .conftest import MakeEngine, eventually

POLL = 30.0  # poll_interval_seconds: no poll comes due while a test runs


@pytest.fixture
def postgres_url(database_url: str) -> str:
    if database_url.startswith("sqlite"):
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; on SQLite a worker learns at its looks")
    return database_url


async def _asleep(engine: NativeEngine, n_ms: int, *, grow: bool = False) -> tuple[str, float]:
    """A napper run (``ctx.step.sleep`` of ``n_ms``) left asleep by a worker that stopped:
    its id and the due time of its job (the kernel's clock). ``grow``: a sleep shorter than a
    loaded host's poll and stop can end under the worker (it wakes the run, which completes):
    then another run, with a sleep four times as long."""
    for _ in range(4):
        async with engine.worker(poll_interval=POLL):
            run = await engine.start(w.napper, {"n": n_ms})

            async def settled(run_id: str = run.id) -> bool:
                info = await engine.get_run(run_id)
                return info.stages[0].status == "suspended" or (grow and info.terminal)

            await eventually(settled, timeout=30)
        if (await engine.get_run(run.id)).stages[0].status == "suspended" or not grow:
            return run.id, await _due_time(engine, run.id)
        n_ms *= 4
    raise AssertionError(f"no run was left asleep, the last with a sleep of {n_ms // 4} ms")


async def _due_time(engine: NativeEngine, run_id: str) -> float:
    def read(conn: sa.Connection) -> float:
        q = sa.select(jobs.c.available_at).where(jobs.c.run_id == run_id)
        return float(conn.execute(q).scalar_one())

    return await engine.kernel.db.read(read)


def _counted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[float]:
    """Each call of ``module.name`` from now on, as its time (monotonic)."""
    calls: list[float] = []
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


async def test_a_sleep_left_by_a_stopped_worker_resumes_on_time_on_a_new_worker(
    make_engine: MakeEngine,
) -> None:
    old = await make_engine(w.napper, poll_interval_seconds=POLL)
    # (4 s: longer than stopping one worker and starting the next takes on a loaded host, so
    # that the new worker's first look finds it sleeping, not due)
    run_id, _ = await _asleep(old, 4000)
    assert w.COUNTS["nap"] == 1
    new = await make_engine(w.napper, poll_interval_seconds=POLL)  # a restart, a deploy
    async with new.worker() as host:
        assert host.poll_interval == POLL
        info = await new.wait(run_id, timeout=15)  # (at the poll: after 30 s)
        assert info.status == RunStatus.COMPLETED
        assert info.stages[0].output == 4000
        stats = host.stats()
    assert w.COUNTS["nap"] == 2  # suspended, then resumed
    assert stats["woken_by_poll"] == 0


async def test_sleeps_left_by_a_stopped_worker_resume_in_turn(make_engine: MakeEngine) -> None:
    """Two sleeps ending seconds apart: the look after the first one's wake tells the new
    worker the second one's time (a look tells it only the earliest)."""
    old = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with old.worker(poll_interval=POLL):
        first = await old.start(w.napper, {"n": 4000})
        second = await old.start(w.napper, {"n": 6000})

        async def both_asleep() -> bool:
            runs = [await old.get_run(r.id) for r in (first, second)]
            return all(r.stages[0].status == "suspended" for r in runs)

        await eventually(both_asleep, timeout=30)
    new = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with new.worker(concurrency=1) as host:
        for run in (first, second):
            assert (await new.wait(run.id, timeout=20)).status == RunStatus.COMPLETED
        assert host.stats()["woken_by_poll"] == 0


async def test_a_sleep_that_ended_while_no_worker_ran_resumes_when_one_starts(
    make_engine: MakeEngine,
) -> None:
    old = await make_engine(w.napper, poll_interval_seconds=POLL)
    # (before grow, beside a CPU hog on 2026-12-07: the worker woke the run before a poll saw it
    # asleep, and the wait for its suspension timed out)
    run_id, due = await _asleep(old, 300, grow=True)

    async def over() -> bool:
        return old.kernel.now() > due

    await eventually(over, timeout=30)
    assert (await old.get_run(run_id)).stages[0].status == "suspended"  # nobody woke it
    new = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with new.worker():
        info = await new.wait(run_id, timeout=15)
    assert info.status == RunStatus.COMPLETED


async def test_an_idle_worker_looks_ahead_without_spinning(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker with nothing due and a run asleep for an hour: its timer is set for that
    hour, its loop waits for it (or the poll) without looking again and again."""
    old = await make_engine(w.napper, poll_interval_seconds=POLL)
    run_id, due = await _asleep(old, 3_600_000)
    looks = _counted(monkeypatch, _jobs, "next_due")
    claims = _counted(monkeypatch, _kernel, "_claim_and_begin")
    new = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with new.worker() as host:

        async def armed() -> bool:
            return [at for at, _ in host._due_times] == [due]

        await eventually(armed, timeout=15)
        begin, claimed = len(looks), len(claims)
        await asyncio.sleep(2.0)  # (a window to count in, not a synchronisation)
        during, claimed = len(looks) - begin, len(claims) - claimed
        assert (await new.get_run(run_id)).stages[0].status == "suspended"
    # (on PostgreSQL the LISTEN connection, once up, wakes the worker once: a claim, or a
    # look, more; a worker that spun looked hundreds of times)
    assert during <= 2, f"{during} looks for work in 2 s of idling"
    assert claimed <= 1, f"{claimed} claim transactions in 2 s of idling"
    assert len(claims) <= 1


async def test_a_worker_learns_only_the_due_times_of_what_it_serves(
    make_engine: MakeEngine,
) -> None:
    old = await make_engine(w.napper, poll_interval_seconds=POLL)
    await _asleep(old, 3_600_000)
    new = await make_engine(w.napper, w.linear, poll_interval_seconds=POLL)
    linear = version_key(w.linear.id, w.linear.version)
    other = WorkerHost(new.kernel, served=frozenset({linear}), poll_interval=POLL)
    serving = WorkerHost(new.kernel, poll_interval=POLL)
    async with other, serving:

        async def looked() -> bool:
            return bool(other._next_survey and serving._due_times)

        await eventually(looked, timeout=15)
        assert other._due_times == [] and other._timer is None
        assert len(serving._due_times) == 1


async def test_a_sleep_recorded_after_a_look_resumes_on_time_when_its_worker_stops(
    postgres_url: str, make_engine: MakeEngine
) -> None:
    """A rolling deploy on PostgreSQL: the new worker (another process) has looked already
    when the old one records a sleep and stops; the old one's stop tells it (one NOTIFY) to
    look again, and it wakes at the sleep's due time, not at its poll."""
    new = await make_engine(w.napper, poll_interval_seconds=POLL)
    async with new.worker() as host:

        async def listening() -> bool:
            return bool(host.listening.is_set() and host._next_survey)

        await eventually(listening, timeout=30)
        old = await make_engine(w.napper, poll_interval_seconds=POLL)
        run_id, _ = await _asleep(old, 4000)  # (its worker stops once the stage sleeps)
        info = await new.wait(run_id, timeout=15)  # (at the poll: up to 30 s)
        assert info.status == RunStatus.COMPLETED
        assert host.stats()["woken_by_poll"] == 0
