"""Fixtures for the native driver's integration tests: engines on the real database of the
parametrized ``database_url`` (a SQLite file, or a fresh PostgreSQL schema)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import NativeEngine
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
        s = EngineSettings(database_url=database_url, **settings)
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
