"""The dev server the tests and ``wfe dev temporal`` start picks free ports, but a port is
free when picked, not when the server binds it: another server starting beside it, or a
client's ephemeral port, may take it in between, and ``temporal server start-dev`` exits
(code 1). Seen in the suite: the bench smoke test's dev server exited so while other tests'
servers were starting. A server on ports it picked starts again on others; one on a port
the caller gave fails at once, with the server's last log line."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

import driver_temporal._devserver as devserver
from driver_temporal import TemporalDevServer
from engine_port.errors import DriverUnavailableError

pytestmark = pytest.mark.temporal


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process holds (listening) for the test's duration."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


async def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = devserver._free_port
    picks = iter([taken_port])
    monkeypatch.setattr(devserver, "_free_port", lambda: next(picks, None) or real())
    server = TemporalDevServer(headless=True)
    assert server.port == taken_port  # (the pick that another process holds)
    async with server:
        assert server.port != taken_port
        from temporalio.client import Client

        client = await Client.connect(server.address)
        assert (await client.count_workflows()).count == 0


async def test_a_port_the_caller_gave_that_is_taken_fails_at_once_saying_why(
    taken_port: int,
) -> None:
    server = TemporalDevServer(headless=True, port=taken_port)
    with pytest.raises(DriverUnavailableError, match="exited with code") as raised:
        await server.start()
    assert "address already in use" in str(raised.value).lower()
    assert server._proc is None  # (stopped: nothing left running)
