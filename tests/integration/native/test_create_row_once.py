"""A run's row is written once by the transaction that creates it (issue 12, PostgreSQL server
work): inserted as the schedule leaves it (running when its first stage is handed to a local
worker, its group counts, the number of its first events), its first events numbered 1, 2,
... beside it. It was inserted pending and then updated in the same transaction (the status,
the group counts, the events' numbers taken from the row): on PostgreSQL a second version of
the row and, the status being indexed, an entry in each of its eight indexes more a run.
The events keep their numbers, the run its counter, whatever comes after."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from greenlet import getcurrent

from driver_native import NativeEngine
from driver_native._db import Database
from driver_native._schema import runs

from . import workflows as w
from .conftest import MakeEngine

_RUN_UPDATE = re.compile(r"\bUPDATE\s+wfe_runs\b", re.IGNORECASE)


class Creations:
    """The SQL sent by the transactions that create runs (``_create_run_once``), told apart
    from the worker's by the greenlet that runs them (a database thread's or the loop's)."""

    def __init__(self) -> None:
        self.inside: set[int] = set()
        self.sql: list[str] = []

    def statement(self, _c: Any, _cur: Any, sql: str, *_a: Any) -> None:
        if id(getcurrent()) in self.inside:
            self.sql.append(sql)

    def listen(self, engine: NativeEngine) -> None:
        sa.event.listen(engine.kernel.db.engine, "before_cursor_execute", self.statement)

    def run_updates(self) -> list[str]:
        return [s for s in self.sql if _RUN_UPDATE.search(s)]


@pytest.fixture
def creations(monkeypatch: pytest.MonkeyPatch) -> Iterator[Creations]:
    seen = Creations()
    original = Database._tx_once

    def tracked(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        if getattr(fn, "__name__", "") != "_create_run_once":
            return original(self, attempt, fn, *a, **k)
        me = id(getcurrent())
        seen.inside.add(me)
        try:
            return original(self, attempt, fn, *a, **k)
        finally:
            seen.inside.discard(me)

    monkeypatch.setattr(Database, "_tx_once", tracked)
    yield seen


async def _event_seq(engine: NativeEngine, run_id: str) -> int:
    def q(conn: sa.Connection) -> int:
        return int(
            conn.execute(sa.select(runs.c.event_seq).where(runs.c.id == run_id)).scalar_one()
        )

    return await engine.kernel.db.tx(q)


async def test_a_run_queued_for_any_worker_is_inserted_and_not_updated(
    make_engine: MakeEngine, creations: Creations
) -> None:
    engine = await make_engine(w.linear)
    creations.listen(engine)
    run = await engine.start(w.linear, {"n": 1})  # (no worker here: its first job is queued)
    assert any(re.search(r"INSERT\s+INTO\s+wfe_runs\b", s, re.I) for s in creations.sql)
    assert not creations.run_updates(), creations.sql
    info = await engine.get_run(run.id)
    assert info.status == "pending"
    events = await engine.events(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)) and events
    assert events[0].type == "run.created"
    assert await _event_seq(engine, run.id) == len(events)

    async with engine.worker(maintenance_interval=3600):  # (then it runs as any run does)
        done = await engine.wait(run.id, timeout=60)
    assert done.status == "completed" and done.output == {"result": 5}
    events = await engine.events(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert await _event_seq(engine, run.id) == len(events)


async def test_a_run_handed_to_a_local_worker_is_inserted_running(
    make_engine: MakeEngine, creations: Creations
) -> None:
    engine = await make_engine(w.linear)
    creations.listen(engine)
    async with engine.worker(maintenance_interval=3600):
        ids = [(await engine.start(w.linear, {"n": n})).id for n in range(3)]
        done = [await engine.wait(i, timeout=60) for i in ids]
    assert [d.output for d in done] == [{"result": 2 * n + 3} for n in range(3)]
    assert creations.sql and not creations.run_updates(), creations.sql
    for run_id in ids:
        events = await engine.events(run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events][:2] == ["run.created", "run.started"]
        assert events[-1].type == "run.completed"
        assert await _event_seq(engine, run_id) == len(events)
