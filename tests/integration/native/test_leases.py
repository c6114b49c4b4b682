"""Leases: a dead worker's job is reaped after expiry and finished by a live worker with the
same attempt; heartbeats keep a long stage's lease; graceful shutdown releases leases."""

from __future__ import annotations

import asyncio
import contextlib

import sqlalchemy as sa

from driver_native import ClaimPending, ExecuteJob, ReapStaleLeases, _schema
from driver_native._engine import NativeEngine
from engine_port import StageContext, Workflow

from . import workflows as w
from .conftest import MakeEngine, eventually, types


async def _job(engine: NativeEngine, run_id: str) -> sa.Row:  # type: ignore[type-arg]
    def q(conn: sa.Connection) -> sa.Row:  # type: ignore[type-arg]
        t = _schema.jobs
        return conn.execute(sa.select(t).where(t.c.run_id == run_id)).one()

    return await engine.kernel.db.tx(q)


async def _reaped(engine: NativeEngine) -> int:
    n: int = await engine.kernel.dispatch(ReapStaleLeases())
    return n


async def test_dead_workers_claim_is_reaped_and_taken_over(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear, lease_seconds=0.5)
    run = await engine.start("it-linear", {"n": 1})
    (job,) = await engine.kernel.dispatch(ClaimPending("dead-worker", limit=1))
    assert job.run_id == run.id
    assert await _reaped(engine) == 0  # the lease is still valid
    assert (await engine.kernel.dispatch(ClaimPending("live", limit=1))) == []
    assert await eventually(lambda: _reaped(engine), timeout=5) == 1
    row = await _job(engine, run.id)
    assert (row.status, row.lease_owner, row.attempt) == ("ready", None, 1)
    async with engine.worker(worker_id="live"):
        info = await engine.wait(run.id, timeout=10)
    assert info.status == "completed"
    assert info.stage("a").attempt == 1
    events = await engine.events(run.id)
    assert types(events, "a") == ["stage.started", "stage.completed"]
    assert events[2].data.get("attempt") == 1
    assert w.COUNTS["a"] == 1


async def test_worker_dying_mid_stage_keeps_attempt_and_started_event(
    make_engine: MakeEngine,
) -> None:
    """A worker that began the attempt and died (its task vanished, no release): after the
    lease expires another worker re-runs the body under the same attempt, no second
    stage.started."""
    engine = await make_engine(w.held, lease_seconds=0.5)
    w.BLOCK["slow"] = True
    run = await engine.start("it-held", {"n": 1})
    (job,) = await engine.kernel.dispatch(ClaimPending("doomed", limit=1))
    task = asyncio.create_task(engine.kernel.dispatch(ExecuteJob(job, "doomed")))
    await asyncio.wait_for(w.started("slow").wait(), 5)
    task.cancel()  # a crash: no outcome recorded, no lease released, heartbeats stop
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert (await _job(engine, run.id)).lease_owner == "doomed"
    assert await eventually(lambda: _reaped(engine), timeout=5) == 1
    w.BLOCK["slow"] = False
    async with engine.worker(worker_id="survivor"):
        info = await engine.wait(run.id, timeout=10)
    assert info.status == "completed"
    assert info.stage("slow").attempt == 1
    assert w.COUNTS["slow"] == 2
    events = await engine.events(run.id)
    assert types(events, "slow") == ["stage.started", "stage.completed"]
    assert types(events)[:2] == ["run.created", "run.started"]


async def test_heartbeats_keep_a_long_stage_leased(make_engine: MakeEngine) -> None:
    # (a lease of 2 s, a heartbeat every 0.5 s: 1.5 s of slack for a loop or a database
    # slowed by a busy machine; 0.5 s left 0.33 s and 1.2 s left 0.8 s, and CI's load (two
    # test processes beside a CPU hog) ate both)
    engine = await make_engine(w.held, lease_seconds=2.0)
    w.BLOCK["slow_for"] = True
    run = await engine.start("it-held", {"n": 40})  # the stage runs 4 s: 2 leases
    reaped = 0
    expiries: set[float] = set()

    async def reaper() -> None:
        nonlocal reaped
        while True:
            reaped += await _reaped(engine)
            with contextlib.suppress(Exception):
                row = await _job(engine, run.id)
                if row.lease_expires_at is not None and row.stage_id == "slow":
                    expiries.add(row.lease_expires_at)
            await asyncio.sleep(0.05)

    r = asyncio.create_task(reaper())
    try:
        async with engine.worker(maintenance_interval=0.1):
            info = await engine.wait(run.id, timeout=30)
    finally:
        r.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await r
    assert info.status == "completed"
    assert reaped == 0
    assert len(expiries) >= 3  # the lease was extended several times
    assert w.COUNTS["slow"] == 1
    assert types(await engine.events(run.id), "slow") == ["stage.started", "stage.completed"]


async def test_graceful_shutdown_releases_the_lease(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.held, lease_seconds=30)
    w.BLOCK["slow"] = True
    run = await engine.start("it-held", {"n": 1})
    async with engine.worker(worker_id="leaving", shutdown_timeout=0.2) as host:
        await asyncio.wait_for(w.started("slow").wait(), 5)
        stats = host.stats()
        assert stats["worker_id"] == "leaving"
        assert stats["running"] == 1
        assert stats["claimed"] == 1
    stats = host.stats()
    assert stats["released"] == 1
    assert stats["running"] == 0
    row = await _job(engine, run.id)
    assert (row.status, row.lease_owner, row.attempt) == ("ready", None, 1)
    w.BLOCK["slow"] = False
    async with engine.worker(worker_id="next") as host2:
        info = await engine.wait(run.id, timeout=10)
        await eventually(lambda: asyncio.sleep(0, host2.stats().get("completed", 0) == 2))
    assert info.status == "completed"
    assert info.stage("slow").attempt == 1
    assert w.COUNTS["slow"] == 2
    assert types(await engine.events(run.id), "slow") == ["stage.started", "stage.completed"]


handed = Workflow("it-handed-held", input=w.Item)


@handed.stage
async def first(ctx: StageContext[w.Item]) -> int:
    return 1


@handed.stage(after=[first])
async def blocked(ctx: StageContext[w.Item]) -> str:
    w.COUNTS["blocked"] += 1
    w.started("blocked").set()
    if w.BLOCK.get("blocked"):
        await asyncio.sleep(3600)
    return "done"


async def test_graceful_shutdown_releases_the_lease_of_a_stage_handed_on(
    make_engine: MakeEngine,
) -> None:
    """A stage handed on to the worker by the previous stage's outcome runs in that stage's
    task (``WorkerHost._run_job``): a stop still finds it running and gives its lease back."""
    engine = await make_engine(handed, lease_seconds=30)
    w.BLOCK["blocked"] = True
    async with engine.worker(worker_id="leaving", shutdown_timeout=0.2) as host:
        run = await engine.start(handed, {"n": 1})
        await asyncio.wait_for(w.started("blocked").wait(), 5)
        stats = host.stats()
        assert stats["running"] == 1
        assert stats["handed_off"] == 2  # (the first stage by the start, then the second)
    stats = host.stats()
    assert stats["released"] == 1
    assert stats["running"] == 0
    rows = await engine.kernel.db.read(
        lambda conn: conn.execute(
            sa.select(_schema.jobs).where(_schema.jobs.c.run_id == run.id)
        ).all()
    )
    assert [(r.stage_id, r.status, r.lease_owner) for r in rows] == [("blocked", "ready", None)]
    w.BLOCK["blocked"] = False
    async with engine.worker(worker_id="next"):
        info = await engine.wait(run.id, timeout=10)
    assert info.status == "completed"
    assert info.stage("blocked").attempt == 1
    assert w.COUNTS["blocked"] == 2
