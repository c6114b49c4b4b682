"""Database access: one SQLAlchemy engine, transactions run on a small thread pool.

SQLite runs in WAL mode with one writer at a time (BEGIN IMMEDIATE, busy_timeout, a single
executor thread per process); PostgreSQL uses psycopg 3 and a pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from engine_port._secrets import redact_text, redact_url
from engine_port.errors import DriverUnavailableError

from . import _schema

__all__ = ["Database"]

P = ParamSpec("P")
T = TypeVar("T")


def _normalise_url(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class Database:
    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self.url = _normalise_url(url)
        parsed = make_url(self.url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self.is_postgres = parsed.get_backend_name() == "postgresql"
        if not (self.is_sqlite or self.is_postgres):
            raise DriverUnavailableError(
                f"database_url {redact_url(url)!r} is not supported; use sqlite:///PATH or "
                "postgresql+psycopg://USER@HOST:PORT/DB"
            )
        if self.is_sqlite:
            db = parsed.database or ""
            if not db or db == ":memory:":
                raise DriverUnavailableError(
                    "the native driver needs a SQLite file (sqlite:///PATH), not an in-memory "
                    "database, so that workers and the CLI share it"
                )
            Path(db).parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = sa.create_engine(
                self.url,
                connect_args={"check_same_thread": False, "timeout": 30},
            )
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "begin", _sqlite_on_begin)
            workers = 1
        else:
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise DriverUnavailableError(
                    "PostgreSQL needs psycopg; install it with: pip install 'wfe[postgres]'"
                ) from None
            self.engine = sa.create_engine(
                self.url, pool_size=pool_size, max_overflow=2, pool_pre_ping=False
            )
            workers = pool_size
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wfe-db")

    # -- transactions -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _reachable(self) -> Iterator[None]:
        """Turn a failure to connect into the port's DriverUnavailableError."""
        try:
            yield
        except OperationalError as exc:
            if _is_connect_error(exc):
                raise DriverUnavailableError(
                    f"cannot reach the database at {redact_url(self.url)}: "
                    f"{redact_text(str(exc.orig), self.url)}; check that "
                    "the server runs and database_url is right"
                ) from None
            raise

    def tx_sync(self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs) -> T:
        """Run ``fn(conn, ...)`` in one transaction, on the calling thread."""
        with self._reachable(), self.engine.begin() as conn:
            return fn(conn, *a, **k)

    def read_sync(
        self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs
    ) -> T:
        """Run read-only ``fn(conn, ...)`` in autocommit: one round trip per query, no
        BEGIN/COMMIT, and on SQLite no write lock."""
        with self._reachable(), self.engine.connect() as raw:
            conn = raw.execution_options(isolation_level="AUTOCOMMIT")
            return fn(conn, *a, **k)

    async def read(
        self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs
    ) -> T:
        loop = asyncio.get_running_loop()
        call = functools.partial(self.read_sync, fn, *a, **k)
        return await loop.run_in_executor(self._executor, call)

    async def tx(self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs) -> T:
        """Run ``fn(conn, ...)`` in one transaction on the database thread pool."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self.tx_sync, fn, *a, **k)
        return await loop.run_in_executor(self._executor, call)

    @property
    def safe_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    # -- schema -----------------------------------------------------------------------------
    def upgrade(self) -> list[int]:
        def run(conn: Connection) -> list[int]:
            if self.is_postgres:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(724401)"))
            return _schema.upgrade(conn)

        return self.tx_sync(run)

    def schema_version(self) -> int:
        return self.tx_sync(_schema.schema_version)

    def dispose(self) -> None:
        self._executor.shutdown(wait=True)
        self.engine.dispose()


def _is_connect_error(exc: OperationalError) -> bool:
    text = str(exc.orig).lower()
    return any(
        s in text
        for s in (
            "connection refused",
            "could not connect",
            "connection failed",
            "does not exist",
            "unable to open database",
            "timeout expired",
            "no such host",
        )
    )


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _sqlite_on_begin(conn: Connection) -> None:
    if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
