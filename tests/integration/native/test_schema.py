"""Versioned schema migrations: a fresh database, and an upgrade from v1 with live runs."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from driver_native import ClaimPending, CreateRun, Database, ExecuteJob, Kernel, _schema
from engine_port import ClaimCheck, EngineSettings, FolderBlobStore, Registry, SystemClock

from . import workflows as w
from .conftest import MakeEngine


def _tables(db: Database) -> set[str]:
    return set(db.tx_sync(lambda c: sa.inspect(c).get_table_names()))


def test_fresh_database_reaches_latest_version(database_url: str) -> None:
    db = Database(database_url)
    try:
        assert db.schema_version() == 0
        applied = db.upgrade()
        assert applied == [v for v, _, _ in _schema.MIGRATIONS]
        assert db.schema_version() == _schema.LATEST_SCHEMA_VERSION
        assert {t.name for t in _schema.metadata.sorted_tables} <= _tables(db)
        assert db.upgrade() == []  # idempotent: nothing left to apply
    finally:
        db.dispose()


async def test_upgrade_from_v1_keeps_existing_runs(
    database_url: str, tmp_path: Path, make_engine: MakeEngine
) -> None:
    db = Database(database_url)
    try:
        assert db.tx_sync(lambda c: _schema.upgrade(c, target=1)) == [1]
        assert db.schema_version() == 1
        assert "wfe_blobs" not in _tables(db)
        settings = EngineSettings(database_url=database_url)
        claim = ClaimCheck(FolderBlobStore(tmp_path / "blobs"))
        kernel = Kernel(db, Registry([w.linear]), settings, claim, SystemClock(), None)
        done_id, _ = await kernel.dispatch(CreateRun("it-linear", {"n": 1}))
        for _ in range(3):
            (job,) = await kernel.dispatch(ClaimPending("v1-host"))
            assert await kernel.dispatch(ExecuteJob(job, "v1-host")) == "completed"
        open_id, _ = await kernel.dispatch(CreateRun("it-linear", {"n": 5}, "key-v1"))
    finally:
        db.dispose()

    engine = await make_engine(w.linear, blob_url=f"file://{tmp_path / 'blobs'}")
    assert engine.kernel.db.schema_version() == _schema.LATEST_SCHEMA_VERSION
    assert "wfe_blobs" in _tables(engine.kernel.db)
    done = await engine.get_run(done_id)
    assert done.status == "completed"
    assert done.output == {"result": 5}
    pending = await engine.get_run(open_id)
    assert pending.status == "pending"
    assert pending.idempotency_key == "key-v1"
    async with engine.worker():
        finished = await engine.wait(open_id, timeout=20)
    assert finished.status == "completed"
    assert finished.output == {"result": 13}
    # 9 lifecycle events + 1 business event, numbered without gaps
    assert [e.seq for e in await engine.events(open_id)] == list(range(1, 11))
