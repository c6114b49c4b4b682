"""SQLite: the WAL is checkpointed on the database thread, never inside a commit on the event
loop (issue 12). SQLite's automatic checkpoint runs in the commit that crosses 1,000 WAL pages
and copies them to the database file with two fsyncs: a 2-10 ms stall of the loop (every run in
flight, heartbeats, ``wait()``) about once per 17 three-stage runs. The WAL must still stay
bounded: a checkpoint that leaves frames behind never lets the WAL start again."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from driver_native import NativeEngine
from driver_native._db import Database
from engine_port import EngineSettings, Registry, create_engine

from . import workflows as w

RUNS = 300  # 1,200 commits on the loop, ~17,000 WAL pages written


async def test_the_loop_never_checkpoints_and_the_wal_stays_bounded(
    tmp_path: Path, monkeypatch: Any
) -> None:
    threads: list[str] = []
    checkpoint = Database._checkpoint

    def recording(self: Database) -> None:
        threads.append(threading.current_thread().name)
        checkpoint(self)

    monkeypatch.setattr(Database, "_checkpoint", recording)
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    engine = create_engine(settings, Registry([w.linear]))
    assert isinstance(engine, NativeEngine)
    wal = tmp_path / "wfe.db-wal"
    async with engine:
        async with engine.worker(maintenance_interval=3600):
            for n in range(RUNS):
                run = await engine.start(w.linear, {"n": n})
                assert (await engine.wait(run.id, timeout=30)).status == "completed"
        inline = engine.kernel.db._inline
        assert inline is not None and inline.conn is not None
        raw = inline.conn.connection.driver_connection
        assert raw is not None
        # before: 1000 (SQLite's default: the loop's own commits checkpointed)
        assert raw.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        pages = wal.stat().st_size // 4096
    # every 64 loop commits (fewer if the database thread lags), on a wfe-db thread
    assert len(threads) >= 5
    assert all(name.startswith("wfe-db") for name in threads)
    # the WAL started again: without the RESTART after the PASSIVE checkpoint, ~17,000 pages
    assert pages < 10_000, pages
