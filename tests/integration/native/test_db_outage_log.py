"""Transparent database retries are visible to an operator: an outage (the server out of
reach) is logged once as a WARNING as it begins and once as an INFO as it ends, whatever
the number of calls retrying meanwhile, and counted in ``worker.stats()``. They were logged
only at DEBUG: nothing showed until ``database_retry_seconds`` ran out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native._engine import NativeEngine
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from tests.support.databases import PostgresSession, TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]


class In(BaseModel):
    pass


async def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout}s"
        await asyncio.sleep(0.02)


def _db_records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "wfe.db" and r.levelno >= logging.INFO
    ]


async def test_an_outage_is_logged_once_as_it_begins_and_once_as_it_ends(
    pg_session: PostgresSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    real = sa.make_url(pg_session.new_schema())
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432)
    await proxy.start()
    url = real.set(port=proxy.port, password="hunter2").render_as_string(hide_password=False)
    wf = Workflow("outage-log", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> str:
        return "ok"

    engine = create_engine(
        EngineSettings(database_url=url, blob_url=f"file://{tmp_path}"), Registry([wf])
    )
    assert isinstance(engine, NativeEngine)
    caplog.set_level(logging.INFO, logger="wfe.db")
    try:
        async with engine, engine.worker(poll_interval=0.05) as worker:
            db = engine.kernel.db
            run = await engine.start(wf.id, {})
            assert (await engine.wait(run.id, timeout=60)).status == "completed"
            assert (worker.stats()["database_retries"], worker.stats()["database_outages"]) == (
                0,
                0,
            )
            assert _db_records(caplog) == []
            for outage in (1, 2):
                proxy.stop()
                # several callers retry at once (and the worker's loop): one outage, one line
                calls = [asyncio.ensure_future(engine.get_run(run.id)) for _ in range(5)]
                await _until(lambda o=outage: db.outages == o, f"outage {outage} noticed")
                await proxy.start()  # (the same port) the server is reachable again
                infos = await asyncio.wait_for(asyncio.gather(*calls), timeout=60)
                assert {i.status for i in infos} == {"completed"}
                records = _db_records(caplog)
                assert [level for level, _ in records] == [logging.WARNING, logging.INFO] * outage
                warning, info = records[-2][1], records[-1][1]
                assert "does not answer" in warning and "database_retry_seconds" in warning
                assert f"127.0.0.1:{proxy.port}" in warning and "hunter2" not in warning
                assert "answers again" in info and "hunter2" not in info
            stats = worker.stats()
            assert stats["database_outages"] == 2
            assert stats["database_retries"] >= 2
    finally:
        proxy.stop()
