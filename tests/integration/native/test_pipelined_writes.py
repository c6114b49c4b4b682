"""Deferred writes (``_db.defer``): on PostgreSQL a write nobody reads waits for the
transaction's next statement or its COMMIT and goes out with it in one multi-statement query
(one network round trip); on SQLite it runs at once. Either way every statement sees the
writes issued before it, and a failing write rolls the whole transaction back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection

from driver_native import _rawsql
from driver_native._db import Database, commit_was_unknown, commit_with_next, defer, shared
from driver_native._schema import command_keys


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.upgrade()
    yield database
    database.dispose()


def _key(key: str, status: str = "in_progress") -> Any:
    return command_keys.insert().values(
        key=key, command="test", fingerprint="f", status=status, created_at=1.0
    )


def _keys(conn: Connection) -> list[tuple[str, str]]:
    rows = conn.execute(
        sa.select(command_keys.c.key, command_keys.c.status).order_by(command_keys.c.key)
    )
    return [(r.key, r.status) for r in rows]


def test_a_deferred_write_is_seen_by_the_next_statement_and_committed(db: Database) -> None:
    def work(conn: Connection) -> list[tuple[str, str]]:
        defer(conn, _key("a"))
        defer(conn, _key("b"))
        defer(conn, sa.update(command_keys).where(command_keys.c.key == "a").values(status="x"))
        seen = _keys(conn)  # the three writes above go out before (or with) this read
        defer(conn, _key("c"))  # and this one with the commit
        return seen

    assert db.tx_sync(work) == [("a", "x"), ("b", "in_progress")]
    assert db.read_sync(_keys) == [("a", "x"), ("b", "in_progress"), ("c", "in_progress")]


@pytest.mark.parametrize("where", ["before a read", "at the commit"])
def test_a_failing_deferred_write_rolls_the_transaction_back(db: Database, where: str) -> None:
    db.tx_sync(lambda conn: conn.execute(_key("taken")))

    def work(conn: Connection) -> None:
        defer(conn, _key("fresh"))
        defer(conn, _key("taken"))  # a duplicate primary key
        if where == "before a read":
            _keys(conn)

    with pytest.raises(sa.exc.IntegrityError):
        db.tx_sync(work)
    assert db.read_sync(_keys) == [("taken", "in_progress")]  # "fresh" was rolled back too
    # the pooled connection is clean afterwards: nothing deferred leaks into the next one
    db.tx_sync(lambda conn: defer(conn, _key("next")))
    assert db.read_sync(_keys) == [("next", "in_progress"), ("taken", "in_progress")]


def test_deferred_writes_and_begin_ride_along_in_one_round_trip(
    db: Database, round_trips: dict[str, list[int]]
) -> None:
    if not db.is_postgres:
        pytest.skip("SQLite has no network round trips: defer() executes at once")

    def work(conn: Connection) -> None:
        _keys(conn)  # BEGIN + this read: one round trip
        defer(conn, _key("a"))
        defer(conn, _key("b"))
        defer(conn, _key("c"))  # the three inserts + COMMIT: one round trip

    db.tx_sync(work)
    assert dict(round_trips) == {"work": [2]}  # (one at a time: BEGIN, 4 statements, COMMIT)
    assert [k for k, _ in db.read_sync(_keys)] == ["a", "b", "c"]


def test_defer_outside_a_transaction_runs_at_once(db: Database) -> None:
    """An autocommit connection has no commit to ride along with: the write is not held."""
    db.read_sync(lambda conn: defer(conn, _key("now")))
    assert db.read_sync(_keys) == [("now", "in_progress")]


def test_a_deferred_insert_whose_key_the_database_generates_still_works(db: Database) -> None:
    """A single-row insert into a table with a generated key reads that key back (RETURNING):
    it goes out at once, with whatever was deferred before it, instead of being held."""
    from driver_native._schema import signals

    def work(conn: Connection) -> list[Any]:
        defer(conn, _key("before"))
        defer(
            conn,
            signals.insert().values(
                run_id="r", name="go", payload=None, consumed=False, received_at=1.0
            ),
        )
        return list(conn.execute(sa.select(signals.c.name)).scalars())

    assert db.tx_sync(work) == ["go"]
    assert db.read_sync(_keys) == [("before", "in_progress")]


_ALL_KEYS = sa.select(command_keys.c.key).order_by(command_keys.c.key)


def test_the_last_reads_of_a_transaction_carry_its_commit(
    db: Database, round_trips: dict[str, list[int]]
) -> None:
    """``commit_with_next``: the transaction's last reads and its COMMIT go out together
    (with its deferred writes and BEGIN: one round trip for the whole of this one); the reads
    see the transaction's writes, which are committed."""

    def work(conn: Connection) -> list[str]:
        defer(conn, _key("a"))
        defer(conn, _key("b"))
        commit_with_next(conn)
        (rows,) = _rawsql.execute_together(conn, [(_ALL_KEYS, {})])
        return [r.key for r in rows]

    assert db.tx_sync(work) == ["a", "b"]
    assert [k for k, _ in db.read_sync(_keys)] == ["a", "b"]
    if db.is_postgres:
        assert dict(round_trips) == {"work": [1]}  # (2 without commit_with_next)
    # the pooled connection is clean afterwards: the next transaction is one of its own
    with pytest.raises(ValueError):
        db.tx_sync(lambda conn: (defer(conn, _key("c")), _keys(conn), _fail()))
    assert [k for k, _ in db.read_sync(_keys)] == ["a", "b"]


def _fail() -> None:
    raise ValueError("the transaction function failed")


def test_a_function_sharing_its_transaction_does_not_end_it(db: Database) -> None:
    """Group commit (``_batch``) runs several functions in one transaction: one of them
    asking to commit with its last reads must not commit the others' writes early."""

    def work(conn: Connection) -> None:
        with shared(conn):
            defer(conn, _key("a"))
            commit_with_next(conn)
            _rawsql.execute_together(conn, [(_ALL_KEYS, {})])
        defer(conn, _key("b"))
        _fail()

    with pytest.raises(ValueError):
        db.tx_sync(work)
    assert db.read_sync(_keys) == []  # neither write committed


def test_a_lost_commit_with_the_last_reads_is_known_to_the_retry(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops while the batch with the COMMIT is out: the transaction runs
    again and ``commit_was_unknown()`` says the first try may have committed."""
    if not db.is_postgres:
        pytest.skip("SQLite has no batch to lose")
    import psycopg

    from driver_native import _db

    real = _db.send_batch
    dropped: list[bool] = []

    def send(cursor: Any, info: Any, tail: Any, last: Any) -> None:
        if not dropped and last and last[-1][0] == "COMMIT":
            dropped.append(True)
            raise psycopg.OperationalError("terminating connection due to administrator command")
        real(cursor, info, tail, last)

    monkeypatch.setattr(_db, "send_batch", send)
    unknown: list[bool] = []

    def work(conn: Connection) -> list[str]:
        unknown.append(commit_was_unknown())
        defer(conn, _key("a"))
        commit_with_next(conn)
        (rows,) = _rawsql.execute_together(conn, [(_ALL_KEYS, {})])
        return [r.key for r in rows]

    assert db.tx_sync(work) == ["a"]
    assert unknown == [False, True]
