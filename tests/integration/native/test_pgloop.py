"""PostgreSQL: transactions awaited on the event loop run there, in greenlets, without a hop
to a database thread or a pool checkout each (test_inline_sqlite.py counts them); the loop
is never held waiting for the server beyond a short bound, so a server reached through the
loop itself (an asyncio proxy or tunnel in the same process) works; a caller cancelled
mid-transaction does not cut the transaction short; more transactions than connections all
complete (issue 12)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import _schema
from driver_native._db import Database
from driver_native._engine import NativeEngine
from engine_port import EngineSettings, Registry, create_engine
from tests.support.databases import PostgresSession, TcpProxy

from . import workflows as w

pytestmark = pytest.mark.postgres


def _engine(url: str, tmp_path: Path) -> NativeEngine:
    engine = create_engine(
        EngineSettings(database_url=url, blob_url=f"file://{tmp_path / 'blobs'}"),
        Registry([w.linear]),
    )
    assert isinstance(engine, NativeEngine)
    return engine


async def test_runs_complete_through_a_proxy_on_the_engines_own_loop(
    pg_session: PostgresSession, tmp_path: Path
) -> None:
    """Every byte between the engine and the server goes through an asyncio proxy on the
    engine's loop: a transaction that held the loop while waiting for its answer would wait
    forever (the proxy cannot forward it)."""
    real = sa.make_url(pg_session.new_schema())
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432)
    await proxy.start()
    url = real.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        async with _engine(url, tmp_path) as engine, engine.worker():
            runs = [await engine.start(w.linear, {"n": n}) for n in range(5)]
            done = await asyncio.wait_for(
                asyncio.gather(*(engine.wait(r.id, timeout=60) for r in runs)), 90
            )
        assert [d.output for d in done] == [{"result": 2 * n + 3} for n in range(5)]
        assert proxy.connections >= 1
    finally:
        proxy.stop()


async def test_a_caller_cancelled_mid_transaction_leaves_it_whole(
    pg_session: PostgresSession,
) -> None:
    """The transaction goes on to its end, as it would on a database thread, and the
    connection is clean for the next one."""
    db = Database(pg_session.new_schema())
    try:
        db.upgrade()
        started = asyncio.Event()

        def slow_write(conn: sa.Connection) -> None:
            conn.execute(sa.text("CREATE TABLE wfe_probe (n int)"))
            started.set()
            conn.execute(sa.text("SELECT pg_sleep(0.3)"))
            conn.execute(sa.text("INSERT INTO wfe_probe VALUES (1)"))

        task = asyncio.create_task(db.tx(slow_write))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        def count(conn: sa.Connection) -> int:
            return int(conn.execute(sa.text("SELECT count(*) FROM wfe_probe")).scalar_one())

        deadline = asyncio.get_running_loop().time() + 10
        while True:  # (the transaction is still running: the table appears at its commit)
            try:
                assert await db.read(count) == 1
                break
            except sa.exc.ProgrammingError:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
        assert (
            await db.read(
                lambda c: c.execute(
                    sa.select(sa.func.count()).select_from(_schema.runs)
                ).scalar_one()
            )
            == 0
        )
    finally:
        db.dispose()


async def test_more_transactions_in_flight_than_connections_all_complete(
    pg_session: PostgresSession,
) -> None:
    """Past the pool's size, transactions wait for a connection on a database thread (the
    loop goes on with the others), and each completes."""
    db = Database(pg_session.new_schema(), pool_size=2)
    try:
        db.upgrade()

        def slow(conn: sa.Connection, n: int) -> int:
            conn.execute(sa.text("SELECT pg_sleep(0.02)"))
            return int(conn.execute(sa.text("SELECT :n"), {"n": n}).scalar_one())

        got = await asyncio.wait_for(asyncio.gather(*(db.tx(slow, n) for n in range(40))), 60)
        assert got == list(range(40))
        assert len(db._loop_conns.idle) <= db._loop_conns.keep  # type: ignore[union-attr]
    finally:
        db.dispose()


async def test_a_connection_the_server_cut_is_let_go_without_holding_the_loop(
    pg_session: PostgresSession,
) -> None:
    """The server cuts a loop connection (pg_terminate_backend, a restart) while the pool is
    exhausted and another transaction waits for it on a database thread, as right after a
    server cut every connection: giving the dead connection back checks nothing out of the
    pool and returns at once. (It used to read the invalidated Connection's ``connection``,
    which checks out a replacement on the loop's thread and, with none to be had, held the
    whole loop for the pool's timeout, 30 s: a worker held that long sends no heartbeat, and
    its leases were taken over while it was alive, in the chaos test.)"""
    db = Database(pg_session.new_schema(), pool_size=2)  # 2 connections + 2 of overflow
    pool: Any = db.engine.pool
    pool._timeout = 3.0  # (30 s by default: how long the loop was held)
    conns = db._loop_conns
    assert conns is not None
    admin = sa.create_engine(pg_session.url, poolclass=sa.NullPool)
    held = [await conns.take() for _ in range(4)]  # the pool is exhausted
    waiter = asyncio.get_running_loop().run_in_executor(db._executor, db.engine.connect)
    try:
        victim = held.pop(0)
        backend = victim.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        with admin.connect() as c:
            c.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})

        def select_one() -> None:  # a transaction, as Database.tx runs it
            with victim.begin():
                victim.execute(sa.text("SELECT 1"))

        with pytest.raises(sa.exc.DBAPIError) as cut:
            await conns.run(select_one)
        assert cut.value.connection_invalidated  # (its pool slot is free again)
        held.append(await asyncio.wait_for(waiter, 10))  # the waiting take() got the slot
        asked: list[object] = []  # every checkout the pool is asked for, even one timing out
        take = pool._do_get
        pool._do_get = lambda: (asked.append(1), take())[1]
        conns.give(victim, usable=False)
        assert asked == []  # (it used to ask here: no slot to be had, the loop held 3 s)
        assert victim.closed
        assert pool.checkedout() == 4  # (the 3 held, and the waiter's)
    finally:
        for conn in held:
            conns.give(conn, usable=True)
        admin.dispose()
        db.dispose()
