"""A run's end is recorded by the worker of its last workflow task (``_run_end``), not by a
local activity: a worker that cannot record it (built without the driver's extern functions)
fails that task instead of closing the run with its last events lost, and the next worker of the
driver ends the run with every event delivered and its state stored for a redrive."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.worker import Worker

from driver_temporal._workflow import GraphWorkflow, workflow_runner
from engine_port import FolderBlobStore, MemorySink, Registry, StageContext, Workflow

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


async def test_a_worker_that_cannot_record_the_end_leaves_the_run_to_one_that_can(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    wf = Workflow("end-elsewhere", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 7

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine:
        run = await engine.start("end-elsewhere", {})
        version = run.version
        acts = engine._activities
        bare = Worker(  # the driver's workflow and activities, not its extern functions
            engine._conn,
            task_queue=engine.task_queue(wf.id, version),
            deployment_config=engine.deployment_config(wf.id, version),
            workflows=[GraphWorkflow],
            activities=[acts.stage, *acts.bookkeeping()],
            workflow_runner=workflow_runner(),
            # (the run's next workflow task waited the default 10 s on this worker's sticky
            # queue once it had stopped, before the server gave it to the engine's worker)
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
        )
        handle = engine._conn.get_workflow_handle(run.id)
        async with bare:
            deadline = time.monotonic() + 60
            while True:
                history = [e.event_type for e in (await handle.fetch_history()).events]
                if EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED in history:
                    break
                assert time.monotonic() < deadline, "the last workflow task never failed"
                await asyncio.sleep(0.05)
        assert (await handle.describe()).close_time is None  # the run did not end there
        assert "run.completed" not in [t for t, _ in trace(sink, run)]
        async with engine.worker():
            info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == 7
    assert trace(sink, run) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("stage.completed", "a"),
        ("run.completed", None),
    ]
    assert await FolderBlobStore(blob_dir).list(f"runs/{run.id}/state.json") != []
