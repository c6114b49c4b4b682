"""Reads while the Temporal server is down (``get_run``, ``list_runs``, ``list_runs_page``,
``list_versions``, ``events``, ``steps``, ``get_run_lazy``) raise ``DriverUnavailableError``
within about the engine's ``unavailable_timeout``, not after temporalio's own ~6-10 s of
retries, and work again once the server is back."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_temporal import create_temporal_engine
from engine_port import EngineSettings, FolderBlobStore, Registry, StageContext, Workflow
from engine_port.errors import DriverUnavailableError

from .test_server_restart import RestartableServer

pytestmark = pytest.mark.temporal

UNAVAILABLE_S = 2.0  # the engine's unavailable_timeout
MARGIN_S = 3.0  # (generous: a noisy 2-CPU machine)
BACK_S = 30.0  # after the restart, a read works again within this


class In(BaseModel):
    n: int = 0


def _registry() -> Registry:
    wf = Workflow("outage-reads", input=In)

    @wf.stage
    async def only(ctx: StageContext[In]) -> int:
        return ctx.input.n

    return Registry([wf])


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RestartableServer]:
    srv = RestartableServer(
        db_filename=tmp_path / "temporal.db", headless=True, log_file=tmp_path / "server.log"
    )
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


async def test_reads_during_an_outage_raise_within_unavailable_timeout(
    server: RestartableServer, tmp_path: Path
) -> None:
    blobs = tmp_path / "blobs"
    engine = create_temporal_engine(
        EngineSettings(
            driver="temporal",
            temporal_address=server.address,
            task_queue="outage-reads",
            blob_url=f"file://{blobs}",
        ),
        _registry(),
        blob_store=FolderBlobStore(blobs),
        heartbeat_timeout=3.0,
        unavailable_timeout=UNAVAILABLE_S,
    )
    async with engine:
        async with engine.worker():
            run = await engine.start("outage-reads", {"n": 3})
            assert (await engine.wait(run.id, timeout=30)).status == "completed"
        await server.down(signal.SIGKILL)
        reads: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_run": lambda: engine.get_run(run.id),
            "list_runs": engine.list_runs,
            "list_runs_page": engine.list_runs_page,
            "list_versions": engine.list_versions,
            "events": lambda: engine.events(run.id),
            "steps": lambda: engine.steps(run.id),
            "get_run_lazy": lambda: engine.get_run_lazy(run.id),
        }
        for name, read in reads.items():
            t = time.monotonic()
            with pytest.raises(DriverUnavailableError) as err:
                # (a bound of the test's own, so that a regression fails rather than hangs)
                await asyncio.wait_for(read(), 30)
            took = time.monotonic() - t
            assert "check that the Temporal server is running" in str(err.value), (name, err)
            assert took < UNAVAILABLE_S + MARGIN_S, (name, took)
        await server.start()
        deadline = time.monotonic() + BACK_S
        while True:
            try:
                info = await engine.get_run(run.id)
                break
            except DriverUnavailableError:
                assert time.monotonic() < deadline, "get_run still fails after the restart"
                await asyncio.sleep(0.2)
        assert (info.status, info.output) == ("completed", 3)
        assert [r.id for r in await engine.list_runs()] == [run.id]
        assert [(v.workflow_id, v.active_runs) for v in await engine.list_versions()] == [
            ("outage-reads", 0)
        ]
