"""Reliability on PostgreSQL with real worker processes: two workers share one database with
no stage body executed twice; a worker SIGKILLed mid-stage is taken over after its lease
expires, with journaled steps not run again and the same event trace as a clean run."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import NativeEngine, _schema
from engine_port import Lifecycle, create_engine
from tests.support.databases import PostgresSession

from . import app
from ._procs import WorkerProcs, counts, eventually

pytestmark = pytest.mark.postgres


class Workers(WorkerProcs):
    """Worker subprocesses running tests/reliability/app.py."""

    def __init__(self, url: str, work: Path) -> None:
        super().__init__(url, work, "tests.reliability.app", "REL_DIR")

    def spawn(self, **env: str) -> subprocess.Popen[bytes]:
        return self.start(**env)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def pg_url(pg_session: PostgresSession) -> str:
    return pg_session.new_schema()


@pytest.fixture
def workers(pg_url: str, work: Path) -> Iterator[Workers]:
    w = Workers(pg_url, work)
    try:
        yield w
    finally:
        w.close()


async def _completed(engine: NativeEngine, ids: list[str]) -> int:
    def q(conn: sa.Connection) -> int:
        t = _schema.runs
        stmt = sa.select(sa.func.count()).where(t.c.id.in_(ids), t.c.status == "completed")
        return int(conn.execute(stmt).scalar_one())

    return await engine.kernel.db.tx(q)


async def test_two_workers_run_200_runs_with_no_stage_executed_twice(
    pg_url: str, work: Path, workers: Workers
) -> None:
    engine = create_engine(app.settings(pg_url, work), app.registry)
    assert isinstance(engine, NativeEngine)
    async with engine:
        procs = [workers.spawn(), workers.spawn()]
        for p in procs:
            workers.wait_ready(p)
        ids = [(await engine.start("rel-three", {"i": i})).id for i in range(200)]

        async def all_done() -> bool:
            return await _completed(engine, ids) == len(ids)

        try:
            await eventually(all_done, 120, "200 completed runs")
        except AssertionError:
            raise AssertionError(workers.logs()) from None
        outputs = {(await engine.get_run(i)).output for i in ids[:5]}
        assert outputs == {2, 3, 4, 5, 6}
    lines = counts(work)
    per = Counter((run, what) for _pid, run, what in lines)
    assert set(per) == {(r, s) for r in ids for s in "abc"}
    assert [k for k, n in per.items() if n != 1] == []  # every stage body ran exactly once
    pids = {pid for pid, _run, _what in lines}
    assert pids == {str(p.pid) for p in procs}  # both processes did work


async def test_sigkilled_worker_is_taken_over_after_its_lease_expires(
    pg_url: str, work: Path, workers: Workers
) -> None:
    engine = create_engine(app.settings(pg_url, work), app.registry)
    assert isinstance(engine, NativeEngine)
    async with engine:
        victim = workers.spawn(REL_BLOCK_B="1", REL_LEASE_SECONDS="1")
        workers.wait_ready(victim)
        run = await engine.start("rel-crash", {"i": 1})
        deadline = time.monotonic() + 30
        while not (work / "marker").exists():
            assert victim.poll() is None, workers.logs()
            assert time.monotonic() < deadline, f"no marker within 30s:\n{workers.logs()}"
            await asyncio.sleep(0.02)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        killed_at = time.monotonic()
        survivor = workers.spawn(REL_LEASE_SECONDS="1")
        workers.wait_ready(survivor)

        async def finished() -> Any:
            info = await engine.get_run(run.id)
            return info if info.terminal else None

        info = await eventually(finished, 30, "completion after the crash")
        assert info.status == "completed"
        assert info.output == "xyc"
        assert info.stage("b").attempt == 1
        assert time.monotonic() - killed_at >= 0.5  # taken over only after the lease expired
        crashed = await engine.events(run.id)
        clean_run = await engine.start("rel-crash", {"i": 2})
        clean = await eventually(lambda: _finished_events(engine, clean_run.id), 30, "clean")

    ran = Counter(what for _pid, r, what in counts(work) if r == run.id)
    assert ran["x"] == 1 and ran["y"] == 1
    assert ran["b"] >= 2 and ran["a"] == 1 and ran["c"] == 1

    def shape(events: list[Any]) -> list[tuple[Any, ...]]:
        return [(e.seq, e.type, e.stage, e.data.get("attempt")) for e in events]

    assert len({e.id for e in crashed}) == len(crashed)
    assert shape(crashed) == shape(clean)
    started_b = [e for e in crashed if e.type == "stage.started" and e.stage == "b"]
    assert [e.id for e in started_b] == [Lifecycle(run.id).stage_started("b", 1).id]


async def _finished_events(engine: NativeEngine, run_id: str) -> Any:
    info = await engine.get_run(run_id)
    return await engine.events(run_id) if info.terminal else None
