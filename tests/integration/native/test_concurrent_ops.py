"""Operations on one run from several engines at once, as several API servers sharing one
PostgreSQL database would call them: each caller gets a correct answer or a typed
``EngineError`` (never a raw database error or a hang), and the run ends in one consistent
state (events numbered without gap or repeat)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native import NativeEngine, _runs
from driver_native._db import Database
from engine_port import NonRetryableError, Retry, StageContext, Workflow
from engine_port.errors import EngineError, RunNotActiveError, RunNotFoundError
from tests.support.databases import PostgresSession

from .conftest import MakeEngine

pytestmark = pytest.mark.postgres

DEADLINE = 20.0  # every wait of these tests is bounded by this many seconds
FAIL = {"on": True}


class Item(BaseModel):
    n: int = 0


redo = Workflow("cc-redo", input=Item)


@redo.stage(retry=Retry(max_attempts=1))
async def only(ctx: StageContext[Item]) -> str:
    if FAIL["on"]:
        raise NonRetryableError("boom")
    return "ok"


collect = Workflow("cc-collect", input=Item)


@collect.stage(signals=["s"])
async def gather_all(ctx: StageContext[Item]) -> list[Any]:
    return [await ctx.step.wait_for_signal("s") for _ in range(ctx.input.n)]


@pytest.fixture
def database_url(pg_session: PostgresSession) -> str:
    return pg_session.new_schema()


async def _failed_run(engine: NativeEngine) -> str:
    FAIL["on"] = True
    run = await engine.start(redo, {})
    async with engine.worker():
        info = await engine.wait(run.id, timeout=DEADLINE)
    assert info.status == "failed"
    FAIL["on"] = False
    return run.id


async def _check_events(engine: NativeEngine, run_id: str) -> None:
    seqs = [e.seq for e in await engine.events(run_id)]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


async def _settle(task: asyncio.Future[Any]) -> Any:
    """The task's result, or the EngineError it raised (anything else fails the test)."""
    try:
        return await asyncio.wait_for(task, DEADLINE)
    except EngineError as exc:
        return exc


async def test_purge_racing_a_redrive_never_deletes_the_redriven_run(
    make_engine: MakeEngine, database_url: str, tmp_path: Path
) -> None:
    """A purge that has picked a failed run while another server redrives it: either the
    purge wins (the run is gone and the redrive says RunNotFoundError) or the redrive wins
    (the purge leaves the now running run alone). Before the purge locked the runs it picked,
    it deleted the run the redrive had just re-started, rows and blobs: a run reported
    ``running`` vanished."""
    engine, other = await make_engine(redo), await make_engine(redo)
    run_id = await _failed_run(engine)
    picked, go = threading.Event(), threading.Event()

    def paused(_c: Any, _cursor: Any, statement: str, *_a: Any) -> None:
        if not picked.is_set() and statement.lstrip().upper().startswith("SELECT"):
            picked.set()  # the purge has chosen its runs: let the redrive in now
            go.wait(DEADLINE)

    def purging(conn: sa.Connection) -> list[str]:
        sa.event.listen(conn, "after_cursor_execute", paused)
        return _runs.purge_runs(conn, time.time() + 3600, 100)

    db = Database(database_url)  # the purging server's own connection, on a thread
    admin = sa.create_engine(sa.make_url(database_url), poolclass=sa.NullPool)
    loop = asyncio.get_running_loop()
    try:
        purge = loop.run_in_executor(None, db.tx_sync, purging)
        assert await loop.run_in_executor(None, picked.wait, DEADLINE)
        redrive = asyncio.ensure_future(other.redrive(run_id))

        def lock_waits() -> int:
            with admin.connect() as c:
                return int(
                    c.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                            "'Lock' AND datname = current_database()"
                        )
                    ).scalar_one()
                )

        deadline = time.monotonic() + DEADLINE
        while not redrive.done() and not await loop.run_in_executor(None, lock_waits):
            assert time.monotonic() < deadline, "the redrive neither ended nor waited"
            await asyncio.sleep(0.01)
        go.set()
        purged = await asyncio.wait_for(purge, DEADLINE)
        answer = await _settle(redrive)
    finally:
        go.set()
        db.dispose()
        admin.dispose()
    if run_id in purged:
        assert isinstance(answer, RunNotFoundError), answer
        with pytest.raises(RunNotFoundError):
            await engine.get_run(run_id)
    else:
        assert not isinstance(answer, BaseException), answer
        async with engine.worker():
            info = await engine.wait(run_id, timeout=DEADLINE)
        assert info.status == "completed"
        await _check_events(engine, run_id)


async def test_two_redrives_at_once_redrive_once(make_engine: MakeEngine) -> None:
    engine, other = await make_engine(redo), await make_engine(redo)
    run_id = await _failed_run(engine)
    answers = [
        await _settle(t)
        for t in [asyncio.ensure_future(e.redrive(run_id)) for e in (engine, other)]
    ]
    refused = [a for a in answers if isinstance(a, RunNotActiveError)]
    assert len(refused) == 1, answers
    async with engine.worker():
        info = await engine.wait(run_id, timeout=DEADLINE)
    assert info.status == "completed"
    events = await engine.events(run_id)
    assert [e.type for e in events].count("run.redriven") == 1
    await _check_events(engine, run_id)


async def test_concurrent_keyed_signals_from_two_engines_queue_each_key_once(
    make_engine: MakeEngine,
) -> None:
    engines = [await make_engine(collect) for _ in range(2)]
    host = await make_engine(collect)
    run = await engines[0].start(collect, {"n": 10})
    async with host.worker():
        deadline = time.monotonic() + DEADLINE
        while (await engines[0].get_run(run.id)).status != "suspended":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        sends = [
            engines[i % 2].signal(run.id, "s", {"k": i % 10}, idempotency_key=f"k{i % 10}")
            for i in range(20)
        ]
        answers = await asyncio.wait_for(asyncio.gather(*sends), DEADLINE)
        info = await host.wait(run.id, timeout=DEADLINE)
    assert sum(a.already_completed for a in answers) == 10
    assert info.status == "completed"
    assert sorted(p["k"] for p in info.output) == list(range(10))
    await _check_events(host, run.id)
