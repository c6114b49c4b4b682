"""A long-lived run's signals cost the same however many it took before (the bound check of
``max_pending_signals`` once counted a run's unconsumed signals by reading every signal it
had ever taken: consumed rows stay, for idempotency keys)."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import Database, _db, _schema
from engine_port import StageContext, Workflow

from . import workflows as w
from .conftest import MakeEngine

holder = Workflow("it-holder", input=w.Item)


@holder.stage(signals=["go", "never"])
async def hold(ctx: StageContext[w.Item]) -> Any:
    return await ctx.step.wait_for_signal("never")


async def test_a_signal_costs_the_same_after_thousands_consumed(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("counts SQLite's virtual machine instructions (PostgreSQL: see the report)")
    work = [0]

    def count() -> int:
        work[0] += 1
        return 0

    opened = _db._sqlite_on_connect

    def on_connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        opened(dbapi_conn, record)
        dbapi_conn.set_progress_handler(count, 50)

    monkeypatch.setattr(_db, "_sqlite_on_connect", on_connect)
    engine = await make_engine(holder)
    run = await engine.start(holder.id, {"n": 1})

    async def cost() -> int:
        before = work[0]
        for i in range(10):
            await engine.signal(run.id, "go", i)
        return work[0] - before

    fresh = await cost()

    def took(conn: sa.Connection) -> None:  # the signals a long-lived run consumed
        conn.execute(
            _schema.signals.insert(),
            [
                {"run_id": run.id, "name": "go", "payload": i, "consumed": True, "received_at": 0}
                for i in range(5_000)
            ],
        )

    await engine.kernel.db.tx(took)
    later = await cost()
    # before: the 10 signals read the 5,000 consumed rows each (~75x the instructions)
    assert later < 1.5 * fresh, (fresh, later)


def test_upgrade_from_v17_adds_the_index_of_unconsumed_signals(database_url: str) -> None:
    db = Database(database_url)
    try:
        db.tx_sync(lambda c: _schema.upgrade(c, target=17))
        # (v1 creates today's tables: a v17 database of old code had no such index)
        db.tx_sync(lambda c: c.execute(sa.text("DROP INDEX ix_wfe_signal_queue_pending")))
        assert db.upgrade()[:1] == [18]  # (then the versions after it)

        def indexes(conn: sa.Connection) -> set[str]:
            return {str(i["name"]) for i in sa.inspect(conn).get_indexes("wfe_signal_queue")}

        assert "ix_wfe_signal_queue_pending" in db.tx_sync(indexes)
    finally:
        db.dispose()
