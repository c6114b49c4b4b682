"""The hot path's statements reuse their DBAPI cursors (``_rawsql``): making and closing a
cursor per statement, and building its description on every read, cost more client CPU than
many of the statements themselves (bench/README.md, 2026-12-01 late)."""

from __future__ import annotations

from typing import Any

import pytest

from driver_native import _rawsql

from . import workflows as w
from .conftest import MakeEngine


async def test_a_run_makes_no_cursor_per_statement(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await make_engine(w.linear)
    seen: dict[int, Any] = {}  # the cursors rows were read on (held: no id is reused)
    real = _rawsql.fetched

    def fetched(cursor: Any) -> list[Any]:
        seen.setdefault(id(cursor), cursor)
        return real(cursor)

    monkeypatch.setattr(_rawsql, "fetched", fetched)
    async with engine.worker(maintenance_interval=3600):
        for n in range(3):  # (every pooled connection has made its cursors)
            warm = await engine.start(w.linear, {"n": n})
            assert (await engine.wait(warm.id, timeout=30)).status == "completed"
        known = set(seen)
        for n in range(5):
            run = await engine.start(w.linear, {"n": n + 10})
            info = await engine.wait(run.id, timeout=30)
            assert info.status == "completed"
    new = set(seen) - known
    # before: a new cursor for each statement (5 runs: ~85 reads on PostgreSQL, ~100 on SQLite)
    assert len(new) <= 2, f"rows of 5 runs were read on {len(new)} new cursors"


async def test_a_failed_statement_does_not_leave_its_cursors_for_the_next(
    make_engine: MakeEngine,
) -> None:
    import sqlalchemy as sa

    engine = await make_engine(w.linear)
    db = engine.kernel.db

    def fails(conn: sa.Connection) -> None:
        _rawsql.execute(conn, sa.text("SELECT * FROM no_such_table"), {})  # type: ignore[arg-type]

    def reads(conn: sa.Connection) -> Any:
        return _rawsql.execute(conn, sa.select(sa.literal(7).label("x")), {}).scalar()

    with pytest.raises(sa.exc.DBAPIError):
        await db.tx(fails)
    assert await db.tx(reads) == 7
