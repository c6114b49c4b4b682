"""The hot-path statements run on the DBAPI cursor (``driver_native._rawsql``) behave as
``conn.execute`` did: typed values both ways, statement listeners, SQLAlchemy's wrapped
errors (which the transaction retry and the callers catch) and, on PostgreSQL, a dropped
connection flagged as invalidated so that the transaction runs again on a fresh one."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError

from driver_native import _rawsql
from driver_native._schema import runs

from .conftest import MakeEngine


def _run_values(run_id: str) -> dict[str, Any]:
    return {
        "id": run_id,
        "workflow_id": "wf",
        "version": "1",
        "status": "pending",
        "input": {"a": [1, 2], "b": None},
        "input_fingerprint": "fp",
        "current_group": 0,
        "event_seq": 0,
        "completed_count": 0,
        "redrive_count": 0,
        "cancel_requested": False,
        "frozen": False,
        "created_at": 1.5,
        "updated_at": 1.5,
    }


def _insert(keys: tuple[str, ...]) -> Any:
    return runs.insert().values({k: sa.bindparam(k, type_=runs.c[k].type) for k in keys})


_SELECT = sa.select(runs.c.id, runs.c.input, runs.c.cancel_requested, runs.c.created_at).where(
    runs.c.id == sa.bindparam("id")
)


async def test_values_round_trip_and_listeners_see_the_statements(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine()
    db = engine.kernel.db
    seen: list[str] = []

    def stmt(_conn: Any, _cursor: Any, statement: str, *_a: Any) -> None:
        seen.append(statement.split(maxsplit=1)[0])

    event.listen(db.engine, "before_cursor_execute", stmt)
    values = _run_values("r1")

    def write(conn: sa.Connection) -> Any:
        _rawsql.execute(conn, _insert(tuple(values)), values, later=True)
        return _rawsql.execute(conn, _SELECT, {"id": "r1"}).first()

    row = await db.tx(write)
    event.remove(db.engine, "before_cursor_execute", stmt)
    assert row is not None
    assert (row.id, row.input, row.cancel_requested, row.created_at) == (
        "r1",
        {"a": [1, 2], "b": None},  # JSON decoded
        False,  # a bool, not 0
        1.5,
    )
    assert row._mapping["id"] == "r1"
    assert [s for s in seen if s in ("INSERT", "SELECT")] == ["INSERT", "SELECT"]


async def test_a_failing_statement_raises_sqlalchemys_error(make_engine: MakeEngine) -> None:
    engine = await make_engine()
    values = _run_values("r2")

    def twice(conn: sa.Connection) -> None:
        _rawsql.execute(conn, _insert(tuple(values)), values)
        _rawsql.execute(conn, _insert(tuple(values)), values)

    with pytest.raises(IntegrityError):
        await engine.kernel.db.tx(twice)

    def deferred_twice(conn: sa.Connection) -> None:
        _rawsql.execute(conn, _insert(tuple(values)), values | {"id": "r3"}, later=True)
        _rawsql.execute(conn, _insert(tuple(values)), values | {"id": "r3"}, later=True)

    with pytest.raises(IntegrityError):  # (at the commit, on PostgreSQL)
        await engine.kernel.db.tx(deferred_twice)
    rows = await engine.kernel.db.read(
        lambda c: c.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one()
    )
    assert rows == 0  # neither transaction committed anything


async def test_a_dropped_postgres_connection_is_flagged_for_the_retry(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine()
    db = engine.kernel.db
    if not db.is_postgres:
        pytest.skip("SQLite has no server connection to drop")

    def drop_then_read(conn: sa.Connection) -> None:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with db.engine.connect() as other:
            other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        _rawsql.execute(conn, _SELECT, {"id": "x"})

    with pytest.raises(DBAPIError) as caught:
        db.engine.dispose()
        with db.engine.begin() as conn:
            drop_then_read(conn)
    assert caught.value.connection_invalidated
