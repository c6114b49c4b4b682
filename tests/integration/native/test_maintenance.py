"""Maintenance whose cost grows with a table (every undelivered event, every active run):
taken beside the worker's loop, off the event loop, seldom when it is slow, and without a
write transaction when it finds nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import FlushOutbox, PurgeRuns, ReapStuckRuns, _jobs, _outbox, _runs
from engine_port import Event, MemorySink
from engine_port.errors import RunNotFoundError

from . import workflows as w
from .conftest import MakeEngine, eventually


async def _pile_up(engine: Any, events: int, *, failed: bool = False) -> None:
    """``events`` undelivered events of made-up runs (nine each), as an outbox with no sink
    anywhere keeps them (one INSERT ... SELECT, SQLite and PostgreSQL alike); ``failed``:
    each run's first event failed and waits an hour for its retry (a sink outage), which
    holds back the run's later events."""

    def insert(conn: sa.Connection) -> None:
        conn.execute(
            sa.text(
                "INSERT INTO wfe_outbox (event_id, run_id, workflow_id, seq, type, data,"
                " business, created_at, status, attempts, next_attempt_at)"
                " WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
                " SELECT 'pile-' || i, 'pile-run-' || (i / 9), 'pile', i % 9, 'run.created',"
                " CAST('{}' AS JSON), FALSE, 0.0, 'pending',"
                " CASE WHEN :failed AND i % 9 = 0 THEN 1 ELSE 0 END,"
                " CASE WHEN :failed AND i % 9 = 0 THEN CAST(:retry AS DOUBLE PRECISION) END FROM g"
            ),
            {"n": events - 1, "failed": failed, "retry": time.time() + 3600},
        )

    await engine.kernel.db.tx(insert)


async def test_a_large_outbox_is_counted_beside_the_loop_and_seldom(
    make_engine: MakeEngine, database_url: str
) -> None:
    # No sink anywhere: every event stays in the outbox, and the worker's gauge counted them
    # all on every maintenance tick, on the event loop itself on SQLite (0.55 s a count at a
    # million events, so a worker stalled half of every second: heartbeats, claims, wait()).
    engine = await make_engine(w.linear)
    await _pile_up(engine, 200_000)
    loop_thread = threading.get_ident()
    counted: list[int] = []  # the thread of each count of the outbox

    def statement(_c: Any, _cur: Any, sql: str, *_: Any) -> None:
        if "count(" in sql.lower() and "wfe_outbox" in sql:
            counted.append(threading.get_ident())

    sa.event.listen(engine.kernel.db.engine, "before_cursor_execute", statement)
    try:
        async with engine.worker(maintenance_interval=0.01, poll_interval=0.01) as host:
            await eventually(lambda: _true(host.stats()["outbox_pending"] == 200_000))
            first = len(counted)
            await asyncio.sleep(1.0)  # (a window of maintenance ticks: ~100 of them)
            again = len(counted) - first
            run = await engine.start(w.linear, {"n": 1})  # the worker still works
            assert (await engine.wait(run.id, timeout=30)).status == "completed"
    finally:
        sa.event.remove(engine.kernel.db.engine, "before_cursor_execute", statement)
    # counted at most ~2 % of the time: a count of 200,000 events takes several ms anywhere,
    # so the next one waits a quarter of a second or more (every 10 ms before)
    assert again <= 8, f"the outbox was counted {again} times in a second"
    if database_url.startswith("sqlite"):
        assert loop_thread not in counted, "the outbox was counted on the event loop"
    assert (await engine.outbox_counts()).pending >= 200_000


async def _true(value: bool) -> bool:
    return value


def _timed(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple[float, float]]:
    """Record when each call of ``module.name`` began and ended (monotonic)."""
    calls: list[tuple[float, float]] = []
    original = getattr(module, name)

    def timed(*a: Any, **k: Any) -> Any:
        started = time.monotonic()
        try:
            return original(*a, **k)
        finally:
            calls.append((started, time.monotonic()))

    monkeypatch.setattr(module, name, timed)
    return calls


def _within(calls: list[tuple[float, float]], begin: float, end: float) -> float:
    """Seconds of ``calls`` between ``begin`` and ``end``."""
    return sum(min(b, end) - max(a, begin) for a, b in calls if b > begin and a < end)


async def test_reaping_stuck_runs_takes_a_write_transaction_only_for_a_stuck_run(
    make_engine: MakeEngine, request: pytest.FixtureRequest
) -> None:
    # Every worker looks for stuck runs (past their deadline, or active without a job) every
    # second; that look read every active run inside a write transaction, which on SQLite
    # held the database's only write lock while it read a backlog of pending runs.
    engine = await make_engine(w.linear)
    run = await engine.start(w.linear, {"n": 1})  # pending: its job waits for a worker
    writes: Counter[str] = request.getfixturevalue("transactions")  # (counted from here)
    assert await engine.kernel.dispatch(ReapStuckRuns()) == 0
    assert not writes, f"write transactions for nothing: {dict(writes)}"

    # the run loses its job (a bug, a hand-edited database) and nothing happens for a while
    def lose_job(conn: sa.Connection) -> None:
        conn.execute(sa.text("DELETE FROM wfe_jobs WHERE run_id = :r"), {"r": run.id})
        conn.execute(
            sa.text("UPDATE wfe_runs SET updated_at = :t WHERE id = :r"),
            {"t": time.time() - 600, "r": run.id},
        )

    await engine.kernel.db.tx(lose_job)
    writes.clear()
    assert await engine.kernel.dispatch(ReapStuckRuns()) == 1
    assert writes["reap_stuck"] == 1
    async with engine.worker():
        assert (await engine.wait(run.id, timeout=30)).status == "completed"


class DownSink(MemorySink):
    async def publish(self, events: Sequence[Event]) -> None:
        raise ConnectionError("the sink is down")


async def test_a_flush_that_finds_every_event_waiting_for_a_retry_looks_again_seldom(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sink outage with a backlog: every run's next event waits for its retry, so a flush
    # reads past all of them to find nothing, then did so again 50 ms later, in a write
    # transaction (on SQLite inline on the event loop, under the only write lock): the
    # worker did little else. A failing sink must never block runs (DESIGN §5).
    engine = await make_engine(w.linear, event_sink=DownSink())
    await _pile_up(engine, 100_000, failed=True)
    looks = _timed(monkeypatch, _outbox, "pending_events")
    async with engine.worker(flush_interval=0.01, poll_interval=0.01):
        await eventually(lambda: _true(bool(looks)))
        begin = looks[0][1]
        await asyncio.sleep(2.0)  # (a window of flush ticks: ~200 of them)
        end = time.monotonic()
        run = await engine.start(w.linear, {"n": 1})  # runs go on
        assert (await engine.wait(run.id, timeout=30)).status == "completed"
    spent = _within(looks, begin, end)
    assert spent / (end - begin) < 0.5, f"looked for due events {spent:.2f}s of {end - begin:.2f}s"


async def test_flushes_of_a_backlog_without_planner_statistics_stay_linear(
    make_engine: MakeEngine, database_url: str
) -> None:
    # PostgreSQL plans a prepared statement for its values five times, then may keep one
    # generic plan. On an outbox that grew faster than autovacuum analyzes it (a sink outage;
    # its statistics still say it is nearly empty) the generic plan of the flush's look
    # compared every undelivered event with every other: 25-50 s a flush at 100,000 events,
    # a worker's stop waiting for it (test_maintenance took 28 s now and then).
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite plans each statement anew")
    engine = await make_engine(w.linear, event_sink=DownSink())
    await _pile_up(engine, 100_000, failed=True)  # (not analyzed: autovacuum waits a minute)

    async def flushes() -> None:
        for _ in range(8):
            assert (await engine.kernel.dispatch(FlushOutbox(limit=500))).published == 0

    await asyncio.wait_for(flushes(), 20)  # (~0.5 s; one generic plan: 25 s or more)


async def test_retention_with_no_run_old_enough_writes_nothing_and_reads_by_creation_time(
    make_engine: MakeEngine, request: pytest.FixtureRequest, database_url: str
) -> None:
    # A worker with retention purges every second. Its query found the finished runs by the
    # status index, i.e. all of them, in a write transaction: 0.15-0.2 s at a million runs
    # every second where none was old enough (the common case).
    engine = await make_engine(w.linear)
    run = await engine.start(w.linear, {"n": 1})
    async with engine.worker():
        assert (await engine.wait(run.id, timeout=30)).status == "completed"
    writes: Counter[str] = request.getfixturevalue("transactions")  # (counted from here)
    assert await engine.kernel.dispatch(PurgeRuns(3600)) == 0
    assert not writes, f"write transactions for nothing: {dict(writes)}"
    if database_url.startswith("sqlite"):
        query = _runs.purgeable(time.time()).limit(500)
        sql = str(query.compile(engine.kernel.db.engine, compile_kwargs={"literal_binds": True}))
        plan = await engine.kernel.db.read(
            lambda c: " ".join(str(r[-1]) for r in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
        )
        assert "ix_wfe_runs_created" in plan, plan
    await asyncio.sleep(0.01)  # (finished before the cutoff of a retention of 0 s)
    assert await engine.kernel.dispatch(PurgeRuns(0)) == 1
    assert writes["purge_runs"] >= 1
    with pytest.raises(RunNotFoundError):
        await engine.get_run(run.id)


async def test_a_backlog_of_a_version_nobody_serves_costs_a_worker_nothing(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker looks for due jobs of the versions it serves every poll (50 ms). With the
    # queue of another version (drained, or another team's workflow in the same database)
    # 200,000 jobs long, each look read all of them: 25 ms of every 50 ms on SQLite.
    engine = await make_engine(w.linear)

    def backlog(conn: sa.Connection) -> None:
        conn.execute(
            sa.text(
                "INSERT INTO wfe_jobs (run_id, stage_id, kind, wfv, status, available_at,"
                " attempt, created_at)"
                " WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
                " SELECT 'gone-' || i, 'a', 'stage', 'gone@v1', 'ready', 0.0, 1, 0.0 FROM g"
            ),
            {"n": 200_000 - 1},
        )

    await engine.kernel.db.tx(backlog)
    looks = _timed(monkeypatch, _jobs, "next_due")
    async with engine.worker(poll_interval=0.05):
        await eventually(lambda: _true(bool(looks)))
        begin = time.monotonic()
        await asyncio.sleep(1.0)  # (~20 polls)
        end = time.monotonic()
        run = await engine.start(w.linear, {"n": 1})
        assert (await engine.wait(run.id, timeout=30)).status == "completed"
    spent = _within(looks, begin, end)
    assert spent / (end - begin) < 0.2, f"looked for due jobs {spent:.2f}s of {end - begin:.2f}s"
