"""Real databases for tests: a temporary SQLite file, or a fresh PostgreSQL schema in a
database created for this test session on the server at WFE_TEST_POSTGRES_URL
(default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest
import sqlalchemy as sa

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def admin_url() -> str:
    url = os.environ.get("WFE_TEST_POSTGRES_URL", DEFAULT_PG)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _unreachable(reason: str) -> None:
    msg = f"PostgreSQL at {admin_url()} is unreachable ({reason}); set WFE_TEST_POSTGRES_URL"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


class PostgresSession:
    """One database per test session; one schema per test."""

    def __init__(self) -> None:
        base = sa.make_url(admin_url())
        self.dbname = f"wfe_test_{uuid.uuid4().hex[:10]}"
        self.admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{self.dbname}"'))
        self.url = base.set(database=self.dbname)
        self.engine = sa.create_engine(self.url, isolation_level="AUTOCOMMIT")

    def new_schema(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with self.engine.connect() as c:
            c.execute(sa.text(f'CREATE SCHEMA "{name}"'))
        opts = quote(f"-csearch_path={name}")
        return self.url.render_as_string(hide_password=False) + f"?options={opts}"

    def close(self) -> None:
        self.engine.dispose()
        with self.admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)'))
        self.admin.dispose()


def postgres_session() -> Iterator[PostgresSession]:
    try:
        session = PostgresSession()
    except Exception as exc:
        _unreachable(str(exc).splitlines()[0])
        raise
    try:
        yield session
    finally:
        session.close()


class TcpProxy:
    """A TCP forwarder to the PostgreSQL server on the test's event loop: stopping it makes
    the server unreachable (new connections refused, open ones cut) for the engine connected
    through it; anything that blocks the loop while waiting for the server hangs behind it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.connections = 0  # accepted so far
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        # known at once: a stop() while the upstream connection is being opened cuts it too
        # (registered only once upstream answered, such a connection outlived the stop and
        # the engine went on talking to the server through it: no outage to see)
        self.writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        if writer.transport.is_closing():  # stopped meanwhile
            up_writer.transport.abort()
            return
        self.writers.append(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
