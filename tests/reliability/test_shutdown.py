"""No shutdown path waits on user code forever: a stage body that ignores cancellation is
left behind after a bounded grace, on both drivers, so a worker (and a test's event loop)
always closes."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conformance._models import Num
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine


def _stubborn(release: asyncio.Event, started: asyncio.Event) -> Workflow[Num]:
    wf = Workflow(f"stubborn-{uuid.uuid4().hex[:6]}", input=Num)

    @wf.stage
    async def a(ctx: StageContext[Num]) -> int:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # ignores the cancel until the test lets it go
        return 1

    return wf


async def _exit_is_bounded(settings: EngineSettings, worker_options: dict[str, Any]) -> None:
    release, started = asyncio.Event(), asyncio.Event()
    wf = _stubborn(release, started)
    engine = create_engine(settings, Registry([wf]))
    try:
        async with engine:
            worker = engine.worker(**worker_options)
            await worker.__aenter__()
            try:
                await engine.start(wf.id, {})
                await asyncio.wait_for(started.wait(), 60)
            finally:
                t0 = time.monotonic()
                # a hang here would be caught by pytest-timeout; the bound is generous on
                # purpose (shutdown grace + the runner's 5 s cancel grace, on a busy machine)
                await asyncio.wait_for(worker.__aexit__(None, None, None), 60)
            assert time.monotonic() - t0 < 60
    finally:
        release.set()  # let the orphaned body end so the event loop closes


async def test_native_worker_exit_does_not_wait_for_a_body_that_ignores_cancel(
    tmp_path: Path,
) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
        blob_url=f"file://{tmp_path / 'blobs'}",
        lease_seconds=1.0,
    )
    await _exit_is_bounded(settings, {"shutdown_timeout": 0.5})


@pytest.mark.temporal
async def test_temporal_worker_exit_does_not_wait_for_a_body_that_ignores_cancel(
    temporal_server: Any, tmp_path: Path
) -> None:
    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_server.address,
        task_queue=f"sd-{uuid.uuid4().hex[:8]}",
        blob_url=f"file://{tmp_path / 'blobs'}",
    )
    await _exit_is_bounded(settings, {"graceful_shutdown_timeout": 0.5})
