"""A transaction or a read runs on the event loop's thread (issue 12). SQLite: when nothing else
holds the writer (no hop to the database thread); when another writer holds it, the loop does
not wait: the call goes to the database thread, which waits for the lock. PostgreSQL: always
(``_pgloop``, more in test_pgloop.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from driver_native import _schema, _worker
from driver_native._db import Database, _Try

from . import workflows as w
from .conftest import MakeEngine


class CountingExecutor(ThreadPoolExecutor):
    """The database thread pool, counting the calls handed to it (thread hops)."""

    hops = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.hops += 1
        return super().submit(fn, *args, **kwargs)


def _counting(db: Database) -> CountingExecutor:
    db._executor.shutdown(wait=True)
    db._executor = CountingExecutor(max_workers=2, thread_name_prefix="wfe-db")
    if db._loop_conns is not None:  # (PostgreSQL: checkouts go through it)
        db._loop_conns.executor = db._executor
    return db._executor


async def test_a_three_stage_run_makes_no_thread_hop_and_no_pool_checkout(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite: the held connections; PostgreSQL: the loop's connections (``_pgloop``)."""
    # (no outbox survey while the run is measured: on SQLite it reads on the database thread,
    # and it comes at least every _SURVEY_MAX_GAP, which a loaded host's warm-up can pass)
    monkeypatch.setattr(_worker, "_SURVEY_MAX_GAP", 3600.0)
    engine = await make_engine(w.linear)
    hops = _counting(engine.kernel.db)
    checkouts: list[object] = []
    event.listen(engine.kernel.db.engine, "checkout", lambda *a: checkouts.append(a))
    async with engine.worker(maintenance_interval=3600):
        # (three at once: the loop keeps a connection for each transaction that overlapped)
        warm = [await engine.start(w.linear, {"n": 0}) for _ in range(3)]
        for one in warm:
            assert (await engine.wait(one.id, timeout=30)).status == "completed"
        hops.hops = 0
        checkouts.clear()
        run = await engine.start(w.linear, {"n": 1})
        info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed" and info.output == {"result": 5}
    # before: 4 of each (a hop and a pool checkout per transaction: create, then one per
    # stage outcome; on PostgreSQL until 2026-12-02). At most one checkout: on a loaded host
    # the caller's start can overlap the worker's claim more than during the warm-up, and the
    # loop then opens (and keeps) one more connection, once. On PostgreSQL that connection is
    # opened on a database thread: its one hop (CI, 2026-12-07: hops 1), no other.
    assert len(checkouts) <= 1
    assert hops.hops == (len(checkouts) if engine.kernel.db.is_postgres else 0)


async def test_the_database_thread_checks_out_its_connection_once(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'wfe.db'}")
    try:
        db.upgrade()
        checkouts: list[object] = []
        event.listen(db.engine, "checkout", lambda *a: checkouts.append(a))
        loop = asyncio.get_running_loop()

        def on_another_thread() -> int:
            return sum(db.tx_sync(_schema.schema_version) for _ in range(3))

        await db.tx(_schema.schema_version)  # (the loop's connection: checked out once)
        for _ in range(3):
            # (transactions the loop could not run: the database thread's, held)
            await loop.run_in_executor(db._executor, db._tx_once, _Try(db._held), _bump)
        assert len(checkouts) == 2
        await asyncio.to_thread(on_another_thread)  # another thread: the pool, as before
        assert len(checkouts) == 5
    finally:
        db.dispose()


def _bump(conn: sa.Connection) -> None:
    conn.execute(sa.update(_schema.schema_info).values(version=_schema.schema_info.c.version))


async def test_a_busy_writer_sends_the_transaction_to_the_database_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "wfe.db"
    db = Database(f"sqlite:///{path}")
    try:
        db.upgrade()
        hops = _counting(db)

        def version(conn: sa.Connection) -> int:
            return int(conn.execute(sa.select(_schema.schema_info.c.version)).scalar_one())

        def bump(conn: sa.Connection) -> int:
            conn.execute(
                sa.update(_schema.schema_info).values(version=_schema.schema_info.c.version + 1)
            )
            return version(conn)

        before = await db.read(version)
        assert await db.tx(bump) == before + 1 and hops.hops == 0  # the writer was free: inline

        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
        try:
            task = asyncio.ensure_future(db.tx(bump))
            for _ in range(20):
                await asyncio.sleep(0.01)  # the loop goes on while the lock is held
            assert not task.done() and hops.hops == 1
            assert await db.read(version) == before + 1  # reads are not blocked (WAL)
        finally:
            other.execute("COMMIT")
            other.close()
        assert await task == before + 2
        assert await db.tx(bump) == before + 3 and hops.hops == 1  # inline again
    finally:
        db.dispose()


async def test_an_error_in_an_inline_transaction_rolls_it_back(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'wfe.db'}")
    try:
        db.upgrade()

        def failing(conn: sa.Connection) -> None:
            conn.execute(sa.update(_schema.schema_info).values(version=0))
            raise ValueError("no")

        with pytest.raises(ValueError):
            await db.tx(failing)
        assert await db.read(_schema.schema_version) == _schema.LATEST_SCHEMA_VERSION
        with pytest.raises(sa.exc.IntegrityError):
            await db.tx(lambda c: c.execute(sa.insert(_schema.schema_info).values(version=None)))
        assert await db.tx(_schema.schema_version) == _schema.LATEST_SCHEMA_VERSION
    finally:
        db.dispose()


async def test_a_read_that_raises_leaves_the_held_connection_usable(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'wfe.db'}")
    try:
        db.upgrade()

        def failing(conn: sa.Connection) -> None:
            conn.execute(sa.select(_schema.schema_info.c.version)).all()
            raise ValueError("no")

        with pytest.raises(ValueError):
            await db.read(failing)
        db.tx_sync(_bump)  # (the writer is free: nothing left open by the read)
        assert await db.tx(_schema.schema_version) == _schema.LATEST_SCHEMA_VERSION
        assert await db.read(_schema.schema_version) == _schema.LATEST_SCHEMA_VERSION
    finally:
        db.dispose()
