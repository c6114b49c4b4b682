"""Small SQL helpers shared by the kernel's transaction functions.

Hot-path statements are built once per shape and executed with bound parameters: building a
SQLAlchemy statement costs ~5x more than executing a prebuilt one (measured in bench/)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite

from engine_port.errors import RunNotFoundError

from ._rawsql import Rows, execute, execute_together
from ._schema import runs, stages

__all__ = [
    "db_clock",
    "db_clock_sql",
    "delete_later",
    "delete_where",
    "in_binds",
    "in_params",
    "lease_until",
    "lock_run",
    "run_and",
    "select_where",
    "stages_of_run",
    "try_run",
    "try_run_query",
    "update_later",
    "update_where",
    "upsert",
]


def db_clock(conn: Connection, now: float) -> Any:
    """Leases compare against the database clock: PostgreSQL's (as a SQL expression, epoch
    seconds), or ``now`` on SQLite, where the database and the host share one clock."""
    if conn.dialect.name == "postgresql":
        return db_clock_sql()
    return now


def db_clock_sql() -> Any:
    """PostgreSQL's clock as epoch seconds (a SQL expression)."""
    return sa.func.extract("epoch", sa.func.clock_timestamp())


def lease_until(conn: Connection, lease: float, now: float) -> Any:
    """When a lease taken now expires (a SQL expression on PostgreSQL)."""
    return db_clock(conn, now) + lease


@functools.cache
def _select(table: Table, keys: tuple[str, ...], lock: bool) -> Any:
    stmt = sa.select(table).where(*(table.c[k] == sa.bindparam(f"k_{k}") for k in keys))
    return stmt.with_for_update() if lock else stmt


@functools.cache
def _update(table: Table, keys: tuple[str, ...], values: tuple[str, ...]) -> Any:
    return (
        sa.update(table)
        .where(*(table.c[k] == sa.bindparam(f"k_{k}") for k in keys))
        .values({v: sa.bindparam(f"v_{v}") for v in values})
    )


@functools.cache
def _delete(table: Table, keys: tuple[str, ...]) -> Any:
    return sa.delete(table).where(*(table.c[k] == sa.bindparam(f"k_{k}") for k in keys))


def select_where(conn: Connection, table: Table, *, lock: bool = False, **keys: Any) -> Rows:
    """``SELECT * FROM table WHERE k1 = :k1 AND ...`` (``FOR UPDATE`` on PostgreSQL)."""
    stmt = _select(table, tuple(keys), lock and conn.dialect.name == "postgresql")
    return execute(conn, stmt, {f"k_{k}": v for k, v in keys.items()})


def update_where(
    conn: Connection, table: Table, where: dict[str, Any], values: dict[str, Any]
) -> Rows:
    params = {f"k_{k}": v for k, v in where.items()} | {f"v_{k}": v for k, v in values.items()}
    return execute(conn, _update(table, tuple(where), tuple(values)), params)


def delete_where(conn: Connection, table: Table, **keys: Any) -> Rows:
    return execute(conn, _delete(table, tuple(keys)), {f"k_{k}": v for k, v in keys.items()})


def update_later(
    conn: Connection, table: Table, where: dict[str, Any], values: dict[str, Any]
) -> None:
    """``update_where`` whose row count nobody reads: on PostgreSQL sent in one round trip
    with the transaction's next statement or its commit (``_db.defer``)."""
    params = {f"k_{k}": v for k, v in where.items()} | {f"v_{k}": v for k, v in values.items()}
    execute(conn, _update(table, tuple(where), tuple(values)), params, later=True)


def delete_later(conn: Connection, table: Table, **keys: Any) -> None:
    """``delete_where`` whose row count nobody reads (see ``update_later``)."""
    execute(conn, _delete(table, tuple(keys)), {f"k_{k}": v for k, v in keys.items()}, later=True)


def upsert(conn: Connection, table: Table, values: dict[str, Any], keys: Sequence[str]) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE, on SQLite and PostgreSQL (nobody reads its
    result: on PostgreSQL it goes out with the transaction's next statement or its commit)."""
    stmt = _upsert(conn.dialect.name == "postgresql", table, tuple(values), tuple(keys))
    execute(conn, stmt, values, later=True)


@functools.cache
def _upsert(postgres: bool, table: Table, columns: tuple[str, ...], keys: tuple[str, ...]) -> Any:
    ins: Any = (postgresql if postgres else sqlite).insert(table)
    stmt = ins.values({c: sa.bindparam(c, type_=table.c[c].type) for c in columns})
    update = {k: stmt.excluded[k] for k in columns if k not in keys}
    return stmt.on_conflict_do_update(index_elements=list(keys), set_=update)


def in_binds(n: int, prefix: str = "id") -> list[Any]:
    """``n`` bind parameters for an ``IN (...)`` list of a statement built once per length
    (``_rawsql`` runs no per-call rendering of expanding parameters)."""
    return [sa.bindparam(f"{prefix}_{i}") for i in range(n)]


def in_params(values: Sequence[Any], prefix: str = "id") -> dict[str, Any]:
    """The parameters of :func:`in_binds` for ``values``."""
    return {f"{prefix}_{i}": v for i, v in enumerate(values)}


def try_run(conn: Connection, run_id: str, *, lock: bool = True) -> Any:
    return select_where(conn, runs, lock=lock, id=run_id).first()


def try_run_query() -> Any:
    """``SELECT * FROM runs WHERE id = :k_id FOR UPDATE`` (built once; PostgreSQL's lock)."""
    return _select(runs, ("id",), True)


def stages_of_run() -> Any:
    """``SELECT * FROM stages WHERE run_id = :k_run_id`` (built once)."""
    return _select(stages, ("run_id",), False)


def run_and(
    conn: Connection, run_id: str, stmt: Any, params: dict[str, Any], *, lock: bool = True
) -> tuple[Any, Rows]:
    """``try_run`` and a read that does not depend on the run row (``stmt``), in one round
    trip on PostgreSQL; the run is locked first, as ``try_run`` then the read would."""
    run_stmt = _select(runs, ("id",), lock and conn.dialect.name == "postgresql")
    got, rows = execute_together(conn, [(run_stmt, {"k_id": run_id}), (stmt, params)])
    return got.first(), rows


def lock_run(conn: Connection, run_id: str) -> Any:
    row = try_run(conn, run_id)
    if row is None:
        raise RunNotFoundError(run_id)
    return row
