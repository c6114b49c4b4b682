"""A closed native engine leaves nothing of its database behind in the process: a process
that makes engine after engine (a test session, a serverless host making one per
invocation, a tool) must not grow with each. The hot-path statements were compiled into a
module-wide cache keyed by the SQLAlchemy dialect, which kept up to 4,096 of them with their
dialects and compilers after their engines had closed: ~1,000 objects an engine, which every
full garbage collection then walked (pauses of over a second beside CPU hogs, long enough
to lose a 3 s job lease)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import pytest
from pydantic import BaseModel
from sqlalchemy import Connection

from driver_native._engine import NativeEngine
from driver_native._pgloop import _Runner
from driver_native._rawsql import _Prepared
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from tests.support.databases import PostgresSession


class In(BaseModel):
    pass


def _flow() -> Workflow[In]:
    wf = Workflow("released", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        return "done"

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        return ctx.output_of(a)

    return wf


async def _dialect_of_a_used_engine(url: str, blobs: Path) -> weakref.ref[object]:
    wf = _flow()
    engine = create_engine(
        EngineSettings(database_url=url, blob_url=f"file://{blobs}"), Registry([wf])
    )
    assert isinstance(engine, NativeEngine)
    async with engine, engine.worker(poll_interval=0.05):
        run = await engine.start(wf.id, {})
        assert (await engine.wait(run.id, timeout=60)).status == "completed"
        await engine.get_run(run.id)
        await engine.list_runs()
        dialect = weakref.ref(engine.kernel.db.engine.dialect)
    return dialect


def _alive(kind: type) -> list[object]:
    return [o for o in gc.get_objects() if isinstance(o, kind)]


async def _released(url: str, blobs: Path, *, dialect_kept: bool = False) -> None:
    """``dialect_kept``: SQLAlchemy's PostgreSQL dialect keeps itself in its own reflection
    caches (functools, up to 128): the statements compiled for it must go all the same."""
    runners_before = len(_alive(_Runner))
    dialect = await _dialect_of_a_used_engine(url, blobs)
    for _ in range(5):  # (the closed engine's cancelled tasks finish on the loop)
        await asyncio.sleep(0)
    gc.collect()
    left = dialect()
    if not dialect_kept:
        assert left is None, "a closed engine's dialect (and its compiled statements) lives on"
    compiled = [p for p in _alive(_Prepared) if getattr(p, "_dialect", None) is left]
    assert left is None or not compiled, f"{len(compiled)} statements of a closed engine live on"
    # (PostgreSQL: the greenlets its transactions ran in, each holding its last result)
    assert len(_alive(_Runner)) <= runners_before


async def test_a_closed_sqlite_engine_leaves_its_statements_behind_nowhere(
    tmp_path: Path,
) -> None:
    await _released(f"sqlite:///{tmp_path / 'wfe.db'}", tmp_path / "blobs")


@pytest.mark.postgres
async def test_a_closed_postgres_engine_leaves_its_statements_behind_nowhere(
    pg_session: PostgresSession, tmp_path: Path
) -> None:
    await _released(pg_session.new_schema(), tmp_path / "blobs", dialect_kept=True)


def _sleep_in_tx(conn: Connection, seconds: float) -> None:
    conn.exec_driver_sql(f"SELECT pg_sleep({seconds})")


@pytest.mark.postgres
async def test_a_transaction_whose_caller_left_ends_before_the_engine_closes(
    pg_session: PostgresSession, tmp_path: Path
) -> None:
    """A transaction begun runs to its end when its caller is cancelled (a heartbeat cancelled
    as its stage ended, a worker's bounded last flush): on PostgreSQL it goes on in a task of
    its own. The engine's close returned while it still ran (with its greenlet and its
    connection), seen beside a CPU hog as a greenlet left after the engine closed; now close
    lets it end first."""
    runners_before = len(_alive(_Runner))
    engine = create_engine(
        EngineSettings(database_url=pg_session.new_schema(), blob_url=f"file://{tmp_path}"),
        Registry([_flow()]),
    )
    assert isinstance(engine, NativeEngine)
    async with engine:
        caller = asyncio.create_task(engine.kernel.db.tx(_sleep_in_tx, 0.5))
        await asyncio.sleep(0.1)  # (the statement is at the server)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not others, f"the closed engine still runs {others}"
    gc.collect()
    assert len(_alive(_Runner)) <= runners_before
