"""What ``cancel()`` returns on the native driver: the run once a worker has ended it, as on
Temporal (it returned the run ``compensating`` while Temporal returned it ``cancelled``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from engine_port import EngineSettings, Registry, RunStatus, WorkflowEngine, create_engine
from engine_port.errors import UnsupportedFeatureError

from . import workflows as w


async def _suspended(engine: WorkflowEngine, run_id: str) -> None:
    deadline = time.monotonic() + 30
    while (await engine.get_run(run_id)).status != RunStatus.SUSPENDED:
        assert time.monotonic() < deadline, "the run never waited for its signal"
        await asyncio.sleep(0.02)


async def test_cancel_from_a_process_without_a_worker_returns_the_cancelled_run(
    database_url: str, tmp_path: Path
) -> None:
    """The production shape: an API process cancels, a worker elsewhere compensates."""
    settings = EngineSettings(database_url=database_url, blob_url=f"file://{tmp_path / 'b'}")
    registry = Registry([w.waiter])
    async with (
        create_engine(settings, registry) as api,
        create_engine(settings, registry) as workers,
        workers.worker(),
    ):
        run = await api.start("it-waiter", {"n": 1})
        await _suspended(api, run.id)
        info = await api.cancel(run.id)
        assert info.status == RunStatus.CANCELLED
        assert {s.id: s.status for s in info.stages} == {
            "prep": "compensated",
            "wait_go": "cancelled",
        }
        assert w.COUNTS["unprep"] == 1


async def test_with_no_worker_cancel_returns_after_cancel_wait(
    database_url: str, tmp_path: Path
) -> None:
    settings = EngineSettings(database_url=database_url, blob_url=f"file://{tmp_path / 'b'}")
    async with create_engine(settings, Registry([w.waiter]), cancel_wait=0.2) as engine:
        run = await engine.start("it-waiter", {"n": 1})
        info = await engine.cancel(run.id)  # nobody compensates: it returns all the same
        assert info.status == RunStatus.COMPENSATING
        assert (await engine.cancel(run.id)).status == RunStatus.COMPENSATING  # a no-op
        async with engine.worker():
            assert (await engine.wait(run.id, timeout=30)).status == RunStatus.CANCELLED
    with pytest.raises(UnsupportedFeatureError, match="cancel_wiat"):
        create_engine(settings, Registry([w.waiter]), cancel_wiat=1)
