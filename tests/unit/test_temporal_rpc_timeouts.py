"""A Temporal call whose own gRPC deadline passes: temporalio raises ``RPCError(CANCELLED,
"Timeout expired")`` (the transport's timeout), not ``DEADLINE_EXCEEDED``. The driver's reads
and client methods passed it to the caller raw (an engine read while the server was being
killed, ``test_outage_reads``); it is the server not answering in time, as
``DEADLINE_EXCEEDED`` is: retried by a read until its deadline, then ``DriverUnavailableError``.
A call cancelled for another reason stays what it is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.service import RPCError, RPCStatusCode

from driver_temporal import _rpc
from engine_port import EngineSettings
from engine_port.errors import DriverUnavailableError


def _timed_out() -> RPCError:
    return RPCError("Timeout expired", RPCStatusCode.CANCELLED, b"")


async def test_a_read_whose_deadline_passed_is_read_again_then_typed() -> None:
    tries: list[timedelta] = []

    async def once_late(timeout: timedelta) -> str:
        tries.append(timeout)
        if len(tries) == 1:
            raise _timed_out()
        return "ok"

    assert await _rpc.read("a describe", once_late, deadline_s=5, initial_s=0.001) == "ok"
    assert len(tries) == 2

    async def always_late(timeout: timedelta) -> str:
        raise _timed_out()

    with pytest.raises(DriverUnavailableError, match="did not answer a describe"):
        await _rpc.read("a describe", always_late, deadline_s=0.05, initial_s=0.001)


class _Engine:
    settings = EngineSettings(driver="temporal", temporal_address="127.0.0.1:1")

    @_rpc.surfaced("the run's status")
    async def late(self) -> None:
        raise _timed_out()

    @_rpc.surfaced("the run's status")
    async def cancelled(self) -> None:
        raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")


async def test_a_client_method_whose_deadline_passed_raises_a_typed_error() -> None:
    with pytest.raises(
        DriverUnavailableError, match=r"127\.0\.0\.1:1 did not answer the run's status"
    ):
        await _Engine().late()
    with pytest.raises(RPCError):  # (not a timeout: not the server's silence)
        await _Engine().cancelled()
