"""Host settings the worker applies (issue 16): retention, and the absolute cap on a job."""

from __future__ import annotations

import asyncio

from driver_native import CreateRun, run_to_completion
from engine_port import Retry, StageContext, Workflow

from . import workflows as w
from .conftest import MakeEngine, eventually

capped = Workflow("it-capped", input=w.Item)


@capped.stage(retry=Retry(max_attempts=1))
async def hangs(ctx: StageContext[w.Item]) -> str:
    await asyncio.sleep(3600)  # no timeout of its own: only job_absolute_timeout ends it
    return "never"


async def test_worker_applies_the_retention_setting(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear, retention=0.2)
    done = await run_to_completion(engine.kernel, CreateRun("it-linear", {"n": 1}))
    assert done.outcome == "completed"
    async with engine.worker(maintenance_interval=0.05):

        async def purged() -> bool:
            return await engine.list_runs() == []

        await eventually(purged, timeout=10)
    assert (await engine.purge(older_than=0)) == 0


async def test_job_absolute_timeout_fails_a_hung_attempt(make_engine: MakeEngine) -> None:
    engine = await make_engine(capped, job_absolute_timeout=0.3)
    async with engine.worker():
        run = await engine.start("it-capped", {"n": 1})
        info = await engine.wait(run.id, timeout=20)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "StageTimeoutError"
