"""The TCP proxy the outage tests cut the database with (tests/support/databases.py): a
stop cuts every connection, also one whose upstream side was still being opened. Such a
connection outlived the stop and the engine went on reaching the server through it, so an
outage test waited a minute for an outage that never came (a loaded CI machine)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.support.databases import TcpProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_a_stop_cuts_a_connection_whose_upstream_is_being_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = TcpProxy("127.0.0.1", port)
    await proxy.start()
    gate, reached = asyncio.Event(), asyncio.Event()
    real_open = asyncio.open_connection

    async def slow_open(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        await gate.wait()  # the upstream answers only after the stop
        return await real_open(*args, **kwargs)

    monkeypatch.setattr(asyncio, "open_connection", slow_open)
    try:
        reader, writer = await real_open("127.0.0.1", proxy.port)
        await asyncio.wait_for(reached.wait(), timeout=30)
        proxy.stop()
        gate.set()
        writer.write(b"ping")
        deadline = time.monotonic() + 30
        got = b"?"
        while time.monotonic() < deadline:
            try:
                got = await asyncio.wait_for(reader.read(4), timeout=1)
            except TimeoutError:
                continue
            except ConnectionError:
                got = b""
            break
        assert got == b"", f"the connection outlived the proxy's stop (read {got!r})"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
