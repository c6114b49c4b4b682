"""Small SQL helpers shared by the kernel's transaction functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite

from engine_port.errors import RunNotFoundError

from ._schema import runs

__all__ = ["lock_run", "try_run", "upsert"]


def upsert(conn: Connection, table: Table, values: dict[str, Any], keys: Sequence[str]) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE, on SQLite and PostgreSQL."""
    ins: Any = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(table)
    stmt = ins.values(**values)
    update = {k: stmt.excluded[k] for k in values if k not in keys}
    conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=update))


def try_run(conn: Connection, run_id: str, *, lock: bool = True) -> sa.Row[Any] | None:
    q = sa.select(runs).where(runs.c.id == run_id)
    if lock and conn.dialect.name == "postgresql":
        q = q.with_for_update()
    return conn.execute(q).first()


def lock_run(conn: Connection, run_id: str) -> sa.Row[Any]:
    row = try_run(conn, run_id)
    if row is None:
        raise RunNotFoundError(run_id)
    return row
