"""A job claimed while its run was being frozen for migration (on PostgreSQL the freeze's
"freeze the ready jobs" update re-reads a row a concurrent claim just leased, and leaves it
leased) must not run: the stage would run here and again on the target."""

from __future__ import annotations

import sqlalchemy as sa

from driver_native import ClaimPending, ExecuteJob, _schema
from driver_native._engine import NativeEngine

from . import workflows as w
from .conftest import MakeEngine


async def _lease_like_a_racing_claim(engine: NativeEngine, run_id: str, worker: str) -> None:
    """Put the run's frozen job back in the state the racing claim commits: leased."""

    def q(conn: sa.Connection) -> None:
        conn.execute(
            sa.update(_schema.jobs)
            .where(_schema.jobs.c.run_id == run_id)
            .values(status="leased", lease_owner=worker, lease_expires_at=10**12)
        )

    await engine.kernel.db.tx(q)


async def _job_statuses(engine: NativeEngine, run_id: str) -> list[str]:
    def q(conn: sa.Connection) -> list[str]:
        t = _schema.jobs
        return [
            str(s)
            for s in conn.execute(sa.select(t.c.status).where(t.c.run_id == run_id)).scalars()
        ]

    return await engine.kernel.db.tx(q)


async def test_a_job_claimed_during_a_freeze_does_not_run(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear)
    k = engine.kernel
    run = await engine.start("it-linear", {"n": 1})
    (job,) = await k.dispatch(ClaimPending("racer", limit=1))
    # the freeze committed first in the race: it saw no leased job
    await k.db.tx(
        lambda conn: conn.execute(
            sa.update(_schema.jobs).where(_schema.jobs.c.id == job.id).values(status="ready")
        )
    )
    snapshot = await engine.export_run(run.id)
    assert [s.status for s in snapshot.stages] == ["pending", "pending", "pending"]
    await _lease_like_a_racing_claim(engine, run.id, "racer")

    assert await k.dispatch(ExecuteJob(job, "racer")) == "skipped"
    assert w.COUNTS["a"] == 0  # the stage did not run on the source
    assert await _job_statuses(engine, run.id) == ["frozen"]
    assert (await engine.get_run(run.id)).stage("a").status == "pending"

    # the move is abandoned: the job is runnable again and runs once
    await engine.abort_export(run.id)
    async with engine.worker():
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed"
    assert w.COUNTS["a"] == 1
