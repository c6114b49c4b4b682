"""A worker whose lease was reaped must not apply its late outcome to a job that reused the id."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from driver_native import ClaimPending, NativeEngine, ReapStaleLeases, Transition
from driver_native._schema import jobs
from engine_port import (
    Completed,
    EngineSettings,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)
from tests.support.databases import PostgresSession  # noqa: F401 - fixture types


async def test_late_outcome_never_lands_on_a_reused_job_id(
    database_url: str, tmp_path: Path
) -> None:
    class In(__import__("pydantic").BaseModel):
        n: int = 0

    wf = Workflow("stale-outcome", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return ctx.input.n

    settings = EngineSettings(
        database_url=database_url, blob_url=f"file://{tmp_path / 'blobs'}", lease_seconds=0.2
    )
    engine = create_engine(settings, Registry([wf]))
    assert isinstance(engine, NativeEngine)
    async with engine:
        kernel = engine.kernel
        first = await engine.start(wf.id, {"n": 1})
        [stale] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
        # worker A stalls; its lease expires and worker B finishes the stage
        import asyncio

        await asyncio.sleep(0.3)
        assert await kernel.dispatch(ReapStaleLeases()) == 1
        [fresh] = await kernel.dispatch(ClaimPending("worker-b", limit=1))
        await kernel.dispatch(Transition(fresh, "worker-b", Completed(1)))
        assert (await engine.get_run(first.id)).status == RunStatus.COMPLETED
        # a new run's job; worker A leases it, so lease owner alone cannot tell the jobs apart
        second = await engine.start(wf.id, {"n": 2})
        [new_job] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
        if new_job.id != stale.id:  # force the id reuse SQLite may or may not do by itself
            await kernel.db.tx(
                lambda c: c.execute(
                    sa.update(jobs).where(jobs.c.id == new_job.id).values(id=stale.id)
                )
            )
        # A's late outcome for the first run arrives now
        result = await kernel.dispatch(Transition(stale, "worker-a", Completed(99)))
        assert result == "discarded"
        remaining = await kernel.db.tx(
            lambda c: c.execute(sa.select(jobs.c.run_id).where(jobs.c.id == stale.id)).all()
        )
        assert [r.run_id for r in remaining] == [second.id]  # the new run's job survived
        assert (await engine.get_run(first.id)).output == 1
