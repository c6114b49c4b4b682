"""Fixtures for the native driver's integration tests: engines on the real database of the
parametrized ``database_url`` (a SQLite file, or a fresh PostgreSQL schema)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import Database, NativeEngine
from engine_port import EngineSettings, Registry, Workflow, create_engine

from . import workflows

MakeEngine = Callable[..., Awaitable[NativeEngine]]


@pytest.fixture(autouse=True)
def _reset_counts() -> Iterator[None]:
    workflows.reset()
    yield
    workflows.reset()


@pytest.fixture
async def make_engine(database_url: str, tmp_path: Path) -> AsyncIterator[MakeEngine]:
    """``await make_engine(*workflows, event_sink=..., clock=..., **settings)``: a connected
    NativeEngine on this test's database; closed at the end of the test."""
    engines: list[NativeEngine] = []

    async def make(
        *wfs: Workflow[Any],
        event_sink: Any = None,
        clock: Any = None,
        blob_store: Any = None,
        **settings: Any,
    ) -> NativeEngine:
        settings.setdefault("blob_url", f"file://{tmp_path / 'blobs'}")
        settings.setdefault("database_url", database_url)  # (another database: a source)
        s = EngineSettings(**settings)
        eng = create_engine(
            s,
            Registry(list(wfs) or workflows.ALL),
            event_sink=event_sink,
            clock=clock,
            blob_store=blob_store,
        )
        assert isinstance(eng, NativeEngine)
        await eng.connect()
        engines.append(eng)
        return eng

    yield make
    for eng in reversed(engines):
        await eng.close()


async def count_rows(engine: NativeEngine, table: str, **where: Any) -> int:
    from driver_native import _schema

    t = _schema.metadata.tables[table]

    def q(conn: sa.Connection) -> int:
        stmt = sa.select(sa.func.count()).select_from(t)
        for k, v in where.items():
            stmt = stmt.where(t.c[k] == v)
        return int(conn.execute(stmt).scalar_one())

    return await engine.kernel.db.tx(q)


async def row_counts(engine: NativeEngine) -> dict[str, int]:
    names = [
        "wfe_runs",
        "wfe_stages",
        "wfe_jobs",
        "wfe_outbox",
        "wfe_signal_queue",
        "wfe_steps",
        "wfe_command_keys",
        "wfe_blobs",
        "wfe_definitions",
    ]
    return {n: await count_rows(engine, n) for n in names}


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.02
) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


def types(events: list[Any], stage: str | None = None) -> list[str]:
    return [e.type for e in events if stage is None or e.stage == stage]


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[int]]]:
    """PostgreSQL network round trips (BEGIN and COMMIT included) per write transaction, by
    the name of its function, in call order: psycopg's blocking waits outside a pipeline and
    one per pipeline sync, counted in the greenlet that runs the transaction (its own on the
    event loop, or a database thread's)."""
    from collections import defaultdict

    from greenlet import getcurrent

    from driver_native._db import Database

    per_call: dict[str, list[int]] = defaultdict(list)
    trips: defaultdict[int, int] = defaultdict(int)

    def count(n: int = 1) -> None:
        trips[id(getcurrent())] += n

    try:
        import psycopg
        from psycopg.pq import TransactionStatus
    except ImportError:
        yield per_call
        return
    execute, leave = psycopg.Cursor.execute, psycopg.Pipeline.__exit__
    commit = psycopg.Connection.commit

    def counted_execute(self: Any, *a: Any, **k: Any) -> Any:
        conn = self.connection
        if conn._pipeline is None:  # (in a pipeline a statement is only queued)
            count()
            if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
                count()  # psycopg's implicit BEGIN, on its own
        return execute(self, *a, **k)

    def counted_exit(self: Any, *a: Any) -> Any:
        count()  # the sync
        return leave(self, *a)

    def counted_commit(self: Any) -> Any:
        if self.info.transaction_status != TransactionStatus.IDLE:
            count()
        return commit(self)

    original = Database._tx_once

    def counting(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        before = trips[id(getcurrent())]
        try:
            return original(self, attempt, fn, *a, **k)
        finally:
            per_call[getattr(fn, "__name__", repr(fn))].append(trips[id(getcurrent())] - before)

    monkeypatch.setattr(Database, "_tx_once", counting)
    monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)
    monkeypatch.setattr(psycopg.Pipeline, "__exit__", counted_exit)
    monkeypatch.setattr(psycopg.Connection, "commit", counted_commit)
    yield per_call


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Write transactions by the name of their function (autocommit reads not counted)."""
    seen: Counter[str] = Counter()
    original = Database._tx_once

    def counting(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        seen[getattr(fn, "__name__", repr(fn))] += 1
        return original(self, attempt, fn, *a, **k)

    monkeypatch.setattr(Database, "_tx_once", counting)
    return seen
