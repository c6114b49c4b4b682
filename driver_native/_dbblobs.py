"""A BlobStore on the database: claim-check payloads as rows of ``wfe_blobs`` (schema v2).

Selected with ``blob_url="db://"``. Useful where no shared folder or S3 bucket exists (several
hosts, one PostgreSQL): every host that reaches the database reaches the blobs. Each call is one
transaction through :meth:`Database.tx`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port.driver import check_key
from engine_port.errors import SpilledPayloadUnavailableError

from ._db import Database
from ._schema import blobs
from ._sql import upsert

__all__ = ["DatabaseBlobStore"]


def _like_prefix(prefix: str) -> str:
    """``prefix`` as a LIKE pattern that matches it literally (escape ``\\``, ``%``, ``_``)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


class DatabaseBlobStore:
    """Blobs as rows of the ``wfe_blobs`` table, keyed by the (checked) blob key."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- transaction bodies -------------------------------------------------------------------
    @staticmethod
    def _put(conn: Connection, key: str, data: bytes) -> None:
        upsert(conn, blobs, {"key": key, "data": data}, ("key",))

    @staticmethod
    def _get(conn: Connection, key: str) -> bytes | None:
        row = conn.execute(sa.select(blobs.c.data).where(blobs.c.key == key)).first()
        return None if row is None else bytes(row.data)

    @staticmethod
    def _has(conn: Connection, key: str) -> bool:
        return conn.execute(sa.select(blobs.c.key).where(blobs.c.key == key)).first() is not None

    @staticmethod
    def _delete(conn: Connection, key: str) -> None:
        conn.execute(sa.delete(blobs).where(blobs.c.key == key))

    @staticmethod
    def _list(conn: Connection, prefix: str) -> list[str]:
        q: Any = sa.select(blobs.c.key).order_by(blobs.c.key)
        if prefix:
            q = q.where(blobs.c.key.like(_like_prefix(prefix), escape="\\"))
        return [str(k) for k in conn.execute(q).scalars()]

    # -- the BlobStore port -------------------------------------------------------------------
    async def put(self, key: str, data: bytes) -> None:
        await self.db.tx(self._put, check_key(key), bytes(data))

    async def get(self, key: str) -> bytes:
        data = await self.db.tx(self._get, check_key(key))
        if data is None:
            raise SpilledPayloadUnavailableError(key)
        return data

    async def has(self, key: str) -> bool:
        return await self.db.tx(self._has, check_key(key))

    async def delete(self, key: str) -> None:
        await self.db.tx(self._delete, check_key(key))

    async def list(self, prefix: str = "") -> list[str]:
        if prefix:
            check_key(prefix.rstrip("/"))
        keys = await self.db.tx(self._list, prefix)
        return [k for k in keys if k.startswith(prefix)]  # LIKE is case-insensitive on SQLite
