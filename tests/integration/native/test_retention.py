"""Purge of terminal runs (rows and blobs) and the run timeout (failed with compensation)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from driver_native import process_available_jobs
from engine_port.errors import RunNotFoundError

from . import workflows as w
from .conftest import MakeEngine, count_rows, eventually, types

RUN_TABLES = ["wfe_runs", "wfe_stages", "wfe_jobs", "wfe_outbox", "wfe_steps"]


@pytest.mark.parametrize("blobs", ["file", "db"])
async def test_purge_removes_terminal_runs_rows_and_blobs(
    make_engine: MakeEngine, tmp_path: Path, blobs: str
) -> None:
    blob_url = "db://" if blobs == "db" else f"file://{tmp_path / 'purge-blobs'}"
    engine = await make_engine(w.big, w.waiter, blob_url=blob_url)
    store = engine.kernel.claim.store
    done = await engine.start("it-big", {"n": 80})  # an 80 KiB input and output: spilled
    active = await engine.start("it-waiter", {"n": 1})
    await process_available_jobs(engine.kernel, 10)
    info = await engine.get_run(done.id)
    assert info.status == "completed" and len(info.output) == 80 * 1024 + 1
    assert await store.list(f"runs/{done.id}/")  # input, step result, stage output
    assert (await engine.get_run(active.id)).status == "suspended"

    async def purged() -> int:
        return await engine.purge(older_than_seconds=0)

    assert await eventually(purged, timeout=5) == 1
    assert await store.list(f"runs/{done.id}/") == []
    assert await count_rows(engine, "wfe_runs", id=done.id) == 0
    for table in RUN_TABLES[1:]:
        assert await count_rows(engine, table, run_id=done.id) == 0, table
    with pytest.raises(RunNotFoundError):
        await engine.get_run(done.id)
    assert (await engine.get_run(active.id)).status == "suspended"  # active runs stay
    assert await count_rows(engine, "wfe_stages", run_id=active.id) == 2


async def test_run_timeout_fails_the_run_and_compensates(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.timed)
    run = await engine.start("it-timed", {"n": 1})
    async with engine.worker(maintenance_interval=0.05):
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "RunTimeoutError"
    assert info.stage("reserve").status == "compensated"
    assert info.stage("dawdle").status == "cancelled"
    assert w.COUNTS["release"] == 1
    assert w.COUNTS["dawdle"] == 1
    evs = types(await engine.events(run.id))
    assert evs[-4:] == ["stage.suspended", "stage.cancelled", "stage.compensated", "run.failed"]


async def test_a_slow_survey_does_not_hold_a_run_timeout_back(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker paces its whole-table looks by their cost, and the run timeout is enforced
    by one of them: a first look that took long (a busy host: 0.4 s here, which paced the next
    one 20 s away) must not leave a run past its timeout running for that long."""
    import driver_native._worker as worker_module

    slow = {"left": 1}
    count = worker_module.count_outbox

    def slow_count(conn: Any) -> Any:
        if slow["left"]:
            slow["left"] -= 1
            time.sleep(0.4)
        return count(conn)

    monkeypatch.setattr(worker_module, "count_outbox", slow_count)
    engine = await make_engine(w.timed)
    run = await engine.start("it-timed", {"n": 1})
    async with engine.worker(maintenance_interval=0.05):
        info = await engine.wait(run.id, timeout=15)
    assert not slow["left"]  # (the first survey was the slow one)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "RunTimeoutError"
