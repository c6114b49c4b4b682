"""Staging a stalled worker whose lease is taken over, without timing: every stage body is
held at a gate of the test's own, and the lease is expired by hand and reaped (heartbeats
are 30 s apart unless a test wants them; then the takeover is one transaction, so that no
heartbeat comes between the expiry and the reap, or the reap and the new claim)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import sqlalchemy as sa

from driver_native import NativeEngine, ReapStaleLeases, _jobs
from driver_native._schema import jobs, signals, steps

SETTINGS: dict[str, Any] = {"lease_seconds": 60.0, "job_heartbeat_interval": 30.0}
BEATING: dict[str, Any] = {"lease_seconds": 60.0, "job_heartbeat_interval": 0.05}
"""Heartbeats that notice a lost lease at once (the takeover is then ``take_over``)."""


class Gates:
    """One gate per call, in call order: call ``i`` waits at gate ``i`` once it is entered."""

    def __init__(self) -> None:
        self.entered: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.open: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.calls = 0
        self.after: list[int] = []  # the calls that went on past the step under test

    async def pass_(self) -> int:
        i = self.calls
        self.calls += 1
        self.entered[i].set()
        await self.open[i].wait()
        return i


def _expire(job_id: int) -> Any:
    return (
        sa.update(jobs)
        .where(jobs.c.id == job_id)
        .values(lease_expires_at=jobs.c.lease_expires_at - 120)
    )


async def expire(engine: NativeEngine, job_id: int) -> None:
    """The stalled worker's lease runs out (without waiting for it); nobody has reaped it yet."""
    await engine.kernel.db.tx(lambda c: c.execute(_expire(job_id)))


async def expire_and_reap(engine: NativeEngine, job_id: int) -> None:
    """The stalled worker's lease runs out (without waiting for it) and is taken back."""
    await expire(engine, job_id)
    assert await engine.kernel.dispatch(ReapStaleLeases()) == 1


async def take_over(engine: NativeEngine, job_id: int, taker: str | None) -> Any:
    """In one transaction: the stalled worker's lease runs out, is reaped and (``taker``
    given) claimed by ``taker``, whose job row is returned (its attempt not begun yet)."""
    kernel = engine.kernel
    now = kernel.now()

    def tx(conn: sa.Connection) -> Any:
        conn.execute(_expire(job_id))
        assert [r.id for r in _jobs.reap_stale(conn, now)] == [job_id]
        if taker is None:
            return None
        [job] = _jobs.claim(conn, taker, None, 1, 60.0, now)
        assert job.id == job_id
        return job

    return await kernel.db.tx(tx)


async def step_rows(engine: NativeEngine, run_id: str) -> dict[str, Any]:
    """Each journaled step: (completed, its result, read through the blob store if spilled)."""

    def q(conn: sa.Connection) -> list[Any]:
        return list(conn.execute(sa.select(steps).where(steps.c.run_id == run_id)).all())

    claim = engine.kernel.claim
    rows = await engine.kernel.db.read(q)
    return {r.name: (bool(r.completed), await claim.load(r.result, run_id=run_id)) for r in rows}


async def unconsumed(engine: NativeEngine, run_id: str) -> int:
    def q(conn: sa.Connection) -> int:
        stmt = sa.select(sa.func.count()).where(
            signals.c.run_id == run_id, signals.c.consumed.is_(False)
        )
        return int(conn.execute(stmt).scalar_one())

    return await engine.kernel.db.read(q)


async def settle(task: asyncio.Task[Any]) -> Any:
    with contextlib.suppress(asyncio.CancelledError):
        return await asyncio.wait_for(task, 10)
    return "cancelled"
