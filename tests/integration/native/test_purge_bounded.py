"""Purge is linear in the runs it purges and never stalls the event loop (issue 11, item 6):
it removes each purged run's own blob folder, leaves every other run's blobs alone, and
deletes rows in batches."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from driver_native import process_available_jobs

from . import workflows as w
from .conftest import MakeEngine, count_rows

PURGED = 30
OTHER_RUNS, FILES_PER_RUN = 100, 40  # a store with 4,000 other blobs


def _fill_other_runs(root: Path) -> list[Path]:
    files = []
    for r in range(OTHER_RUNS):
        folder = root / "runs" / f"other{r:04d}" / "steps" / "s"
        folder.mkdir(parents=True)
        for i in range(FILES_PER_RUN):
            path = folder / f"k{i}"
            path.write_bytes(b"{}")
            files.append(path)
    return files


async def test_purge_touches_only_purged_prefixes_and_keeps_the_loop_responsive(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    root = tmp_path / "purge-blobs"
    engine = await make_engine(w.big, blob_url=f"file://{root}")
    ids = [(await engine.start("it-big", {"n": 80})).id for _ in range(PURGED)]
    await process_available_jobs(engine.kernel, 10 * PURGED)
    for rid in ids:
        assert (await engine.get_run(rid)).status == "completed"
        assert (root / "runs" / rid).is_dir()  # spilled input, step result and output
    others = await asyncio.to_thread(_fill_other_runs, root)

    gaps: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        assert await engine.purge(older_than_seconds=0) == PURGED
    finally:
        stop.set()
        await ticker
    assert max(gaps) < 1.0, f"the event loop stalled {max(gaps):.2f}s during purge"
    for rid in ids:
        assert not (root / "runs" / rid).exists()
        assert await count_rows(engine, "wfe_runs", id=rid) == 0
    assert all(p.is_file() for p in others)  # no other run's blob was touched


async def test_purge_deletes_more_runs_than_one_batch(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from driver_native import _kernel

    engine = await make_engine(w.linear)
    monkeypatch.setattr(_kernel, "PURGE_BATCH", 3)
    ids = [(await engine.start("it-linear", {"n": i})).id for i in range(7)]
    await process_available_jobs(engine.kernel, 100)
    assert await engine.purge(older_than_seconds=0) == 7
    for rid in ids:
        assert await count_rows(engine, "wfe_runs", id=rid) == 0
