"""On PostgreSQL the statements of a transaction go out as one multi-statement query, their
values bound client-side as literals and each statement prepared once per connection
(``driver_native._pgbatch``): every value comes back exactly as written, none is ever read as
SQL, and a failed transaction leaves the connection's prepared statements usable."""

from __future__ import annotations

import math
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection

from driver_native import _rawsql
from driver_native._db import Database, defer
from driver_native._schema import command_keys

HOSTILE = [
    "'; DROP TABLE wfe_command_keys; --",
    "back\\slash \\' \\\\",
    "$1 $2 $$ $tag$",
    "%(key)s %s %% %",
    "E'x' U&'\\0041'",
    "ünïcødé ✓ 😀 \u2028",
    "\n\t\r ;\n;",
    "/* -- */",
    "",
]
Hostile = StrEnum("Hostile", {f"V{i}": text for i, text in enumerate(HOSTILE) if text})
"""Hostile texts as a str enum's values (as the engine's statuses are written)."""
FLOATS = [0.1, 1 / 3, -0.0, 1e308, 5e-324, -1.7976931348623157e308, 1764625455.123456]


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    # one pooled connection, so that every transaction runs on the one connection whose
    # prepared statements the tests look at
    database = Database(database_url, pool_size=1)
    database.upgrade()
    yield database
    database.dispose()


def _insert(key: str, fingerprint: str, created_at: float, result: Any = None) -> Any:
    return command_keys.insert().values(
        key=key,
        command="test",
        fingerprint=fingerprint,
        status="in_progress",
        result=result,
        created_at=created_at,
    )


_BY_FINGERPRINT = (
    sa.select(command_keys.c.key, command_keys.c.created_at, command_keys.c.result)
    .where(command_keys.c.fingerprint == sa.bindparam("fp"))
    .order_by(command_keys.c.key)
)


def test_hostile_values_come_back_exactly_and_are_never_sql(db: Database) -> None:
    texts = [t[:64] for t in HOSTILE]  # (fingerprint is VARCHAR(64))
    keys = [t * 3 for t in HOSTILE]

    def write(conn: Connection) -> None:
        for i, (key, text) in enumerate(zip(keys, texts, strict=True)):
            value = FLOATS[i % len(FLOATS)]
            # deferred writes (sent with the next statement) and one sent at once
            defer(conn, _insert(f"d{key}", text, value, {"text": HOSTILE[i], "n": value}))
            conn.execute(_insert(f"n{key}", text, value, [HOSTILE[i], 2**63 - 1]))

    db.tx_sync(write)

    def read(conn: Connection) -> list[list[Any]]:
        calls = [(_BY_FINGERPRINT, {"fp": text}) for text in texts]
        return [r.all() for r in _rawsql.execute_together(conn, calls)]

    for rows_of_one in (db.tx_sync(read), db.read_sync(read)):
        for i, rows in enumerate(rows_of_one):
            value = FLOATS[i % len(FLOATS)]
            assert [r.key for r in rows] == [f"d{keys[i]}", f"n{keys[i]}"]
            for r in rows:
                assert r.created_at == value
                if db.is_postgres:  # (a SQLite REAL column keeps -0.0 as 0)
                    assert math.copysign(1, r.created_at) == math.copysign(1, value)
            assert rows[0].result == {"text": HOSTILE[i], "n": value}
            assert rows[1].result == [HOSTILE[i], 2**63 - 1]
    count = db.read_sync(lambda c: c.execute(sa.select(sa.func.count()).select_from(command_keys)))
    assert count.scalar() == 2 * len(HOSTILE)  # the table is still there, every row in it


def _prepared(conn: Connection) -> list[str]:
    rows = conn.exec_driver_sql("SELECT name FROM pg_prepared_statements ORDER BY name")
    return [r[0] for r in rows]


def test_statements_are_prepared_once_and_survive_a_failed_transaction(db: Database) -> None:
    if not db.is_postgres:
        pytest.skip("SQLite has no server-side prepared statements")

    def work(conn: Connection, i: int) -> None:
        conn.execute(_BY_FINGERPRINT, {"fp": "f"}).all()
        defer(conn, _insert(f"k{i}", "f", float(i)))

    before = set(db.tx_sync(_prepared))  # (what the schema upgrade prepared)
    for i in range(8):
        db.tx_sync(work, i)
    prepared = db.tx_sync(_prepared)
    assert len(set(prepared) - before) == 2, prepared  # the select and the insert, once each

    with pytest.raises(sa.exc.IntegrityError):
        db.tx_sync(work, 0)  # a duplicate key: the batch fails, the transaction rolls back
    # the statements prepared before stay prepared and in use (psycopg's own statement cache
    # would have sent DEALLOCATE ALL with the rollback: "prepared statement does not exist")
    for i in range(8, 16):
        db.tx_sync(work, i)
    assert db.tx_sync(_prepared) == prepared
    assert len(db.read_sync(lambda c: c.execute(_BY_FINGERPRINT, {"fp": "f"}).all())) == 16


def test_driver_sql_with_positional_values_and_a_literal_percent(db: Database) -> None:
    """``exec_driver_sql`` with ``%s`` placeholders, and statements SQLAlchemy escapes ``%``
    in, bind their values too (written in, not prepared)."""
    marker = "%s'); --"

    def work(conn: Connection) -> list[Any]:
        param = "%s" if db.is_postgres else "?"
        conn.exec_driver_sql(
            "INSERT INTO wfe_command_keys (key, command, fingerprint, status, created_at) "
            f"VALUES ({param}, 'test', {param}, 'done', 1.0)",
            ("pos", marker),
        )
        like = command_keys.c.fingerprint.like("%" + "s')%")
        return list(conn.execute(sa.select(command_keys.c.key).where(like)).scalars())

    assert db.tx_sync(work) == ["pos"]


DOCUMENTS = [{"text": "it's \\ \u2028 😀", "n": [1, None, -0.5]}, ["a'b", {"c": "\\'"}]]
QUOTED = [*HOSTILE, 0, -5, 2**63 - 1, -(2**63), True, False, None]


@pytest.mark.parametrize("scs", ["on", "off"])
def test_values_quoted_by_the_driver_read_as_psycopg_quotes_them(
    database_url: str, scs: str
) -> None:
    """``_pgbatch`` writes common values as literals itself (psycopg's ``as_literal`` cost
    as much as the rest of a statement): the server reads each as it reads psycopg's literal,
    with standard_conforming_strings on and off (then psycopg quotes the strings)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only")
    import psycopg
    from psycopg.types.json import Json, Jsonb

    from driver_native._pgbatch import _Prepared

    url = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute(f"SET standard_conforming_strings = {scs}")
        state = _Prepared(raw)
        assert state.plain is (scs == "on")
        documents = [wrap(d) for d in DOCUMENTS for wrap in (Json, Jsonb)]
        for value in [*QUOTED, *Hostile, *documents]:
            ours, theirs = state.quote(value), state.literal.as_literal(value)
            sql = b"SELECT (" + ours + b")::text, (" + theirs + b")::text"
            got = raw.execute(sql.decode()).fetchone()
            assert got is not None and got[0] == got[1], (value, ours, theirs)
        arrays = [
            ([*HOSTILE, 'q"uote', None, "NULL", "{}", ",", " sp "], b"text[]"),
            ([True, False, None], b"bool[]"),
            ([], b"text[]"),
        ]
        for array, cast in arrays:
            ours, theirs = state.quote(array), state.literal.as_literal(array)
            sql = b"SELECT (" + ours + b")::" + cast + b"::text, (" + theirs + b")::" + cast
            got = raw.execute(sql + b"::text").fetchone()
            assert got is not None and got[0] == got[1], (array, ours, theirs)
        for number in FLOATS:  # (psycopg writes -0.0 bare, which the server reads as 0)
            got = raw.execute(b"SELECT (" + state.quote(number) + b")::float8").fetchone()
            assert got is not None and got[0] == number
            assert math.copysign(1, got[0]) == math.copysign(1, number)
        # a negative number written after a minus sign is a subtraction, never a comment
        assert raw.execute("SELECT 1 -" + state.quote(-5).decode()).fetchone() == (6,)


def test_placeholders_are_numbered_in_the_order_of_their_first_use() -> None:
    # (a pure function: the numbering behind PREPARE; thousands of placeholders, an IN
    # list, are numbered in one pass)
    from driver_native._pgbatch import _numbered

    ids = ", ".join(f"%(id_{i})s" for i in range(3000))
    text, order = _numbered(f"SELECT %(b)s, %(a)s, %(b)s, '%%' WHERE x IN ({ids})")
    assert order[:3] == ("b", "a", "id_0") and len(order) == 3002
    assert text.startswith("SELECT $1, $2, $1, '%' WHERE x IN ($3, $4, ")
    assert text.endswith(", $3002)")
