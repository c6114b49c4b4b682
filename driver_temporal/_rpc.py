"""Temporal RPC calls as the driver makes them: what Temporal asks to retry is retried with
backoff here, what remains reaches the caller as a typed ``EngineError``.

A busy server answers ``RESOURCE_EXHAUSTED`` ("too many requests issued to Worker Deployment
... Please try again later") or ``UNAVAILABLE``; both mean "try again", so ``call`` tries
again with capped exponential backoff and jitter until its deadline, then raises
``DriverUnavailableError``. ``read`` does the same for the engine's read RPCs (describes,
visibility listings) with temporalio's own retries off, so that a read during an outage
raises within the engine's ``unavailable_timeout`` rather than after temporalio's ~10 s.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import random
from collections.abc import Awaitable, Callable, Coroutine
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from temporalio.service import GrpcCompression, PayloadLimitsConfig, RPCError, RPCStatusCode

from engine_port import EngineSettings
from engine_port.errors import DriverUnavailableError

from ._outage import OUTAGE

__all__ = [
    "PAYLOAD_LIMITS",
    "RETRYABLE",
    "UNREACHABLE",
    "call",
    "grpc_compression",
    "read",
    "retryable",
    "silent",
    "status_of",
    "surfaced",
    "unavailable",
]

T = TypeVar("T")
P = ParamSpec("P")

# temporalio warns (TMPRL1103, once per write) past a 2 KiB memo; the driver's ``wfe_run``
# memo lists each stage (``memo_shape = "compact"``), ~8 KiB at the end of a 52-stage run,
# whose size measured no cost at that scale (``bench/README.md``): warn past 32 KiB instead
PAYLOAD_LIMITS = PayloadLimitsConfig(memo_warn_size=32 * 1024)
RETRYABLE = frozenset({RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE})
# what a call that reached no healthy server ends with: down or restarting (UNAVAILABLE: "tcp
# connect error"), overloaded, or silent past the call's deadline
UNREACHABLE = RETRYABLE | {RPCStatusCode.DEADLINE_EXCEEDED}


# a read that failed this way may be tried again (reads are idempotent): the server down,
# restarting or overloaded, its connections cut as it stops ("Unknown: transport error"), an
# attempt past its share of the deadline, or a transient server fault; the codes temporalio's
# own retries take, which ``read`` turns off
_READ_AGAIN = UNREACHABLE | {
    RPCStatusCode.UNKNOWN,
    RPCStatusCode.INTERNAL,
    RPCStatusCode.ABORTED,
    RPCStatusCode.DATA_LOSS,
}


def status_of(exc: RPCError) -> RPCStatusCode | None:
    """The status of a failed call as the driver reads it: a call whose own deadline passed
    (its ``timeout``) fails ``CANCELLED`` "Timeout expired" in temporalio (the transport's
    timeout, not the server's answer), which is ``DEADLINE_EXCEEDED``: the server did not
    answer in time."""
    if exc.status == RPCStatusCode.CANCELLED and exc.message.startswith("Timeout expired"):
        return RPCStatusCode.DEADLINE_EXCEEDED
    return exc.status


def retryable(exc: BaseException) -> bool:
    """Temporal said: try again later."""
    return isinstance(exc, RPCError) and exc.status in RETRYABLE


async def call(
    what: str,
    fn: Callable[[], Awaitable[T]],
    *,
    deadline_s: float = 30.0,
    initial_s: float = 0.05,
    max_s: float = 2.0,
) -> T:
    """``await fn()``, retried while Temporal answers a retryable status; ``what`` names the
    call in the error raised when the server kept refusing for ``deadline_s`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    delay = initial_s
    while True:
        try:
            result = await fn()
        except RPCError as exc:
            if exc.status not in RETRYABLE:
                raise
            if loop.time() + delay > end:
                if exc.status == RPCStatusCode.RESOURCE_EXHAUSTED:
                    raise DriverUnavailableError(
                        f"Temporal kept refusing {what} for {deadline_s:g}s "
                        f"({exc.status.name}: {exc.message}); the server is overloaded: retry "
                        "later or give it more capacity"
                    ) from None
                raise unavailable(exc, None, f"{what} for {deadline_s:g}s") from None
        else:
            OUTAGE.answered()  # (an outage noticed in the core's logs is over: ``_outage``)
            return result
        await asyncio.sleep(delay * (0.5 + random.random() / 2))
        delay = min(delay * 2, max_s)


async def read(
    what: str,
    fn: Callable[[timedelta], Awaitable[T]],
    *,
    deadline_s: float,
    address: str | None = None,
    initial_s: float = 0.05,
    max_s: float = 1.0,
) -> T:
    """``await fn(timeout)``: one read RPC of the engine's (a describe, a page of a listing),
    made with temporalio's own retries off (``retry=False``) and ``timeout`` the time left,
    tried again here while Temporal is down, restarting or overloaded, until ``deadline_s``
    (the engine's ``unavailable_timeout``); then ``DriverUnavailableError``.

    temporalio's retries (``retry=True``, which its high-level calls such as
    ``list_workflows`` always use) ignore the call's ``timeout`` (a per-attempt gRPC
    deadline): a refused connection fails each attempt at once and the core retries for
    ~6-10 s whatever the caller's timeout, so a read during an outage took that long
    whatever ``unavailable_timeout`` said. Reads are idempotent: trying one again is safe."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    delay = initial_s
    while True:
        left = end - loop.time()
        try:
            result = await fn(timedelta(seconds=max(left, 0.05)))
        except RPCError as exc:
            if status_of(exc) not in _READ_AGAIN:
                raise
            left = end - loop.time()
            if left <= 0:
                raise unavailable(exc, address, f"{what} for {deadline_s:g}s") from None
        else:
            OUTAGE.answered()  # (an outage noticed in the core's logs is over: ``_outage``)
            return result
        # (the last attempt at the deadline: a server back by then answers it)
        await asyncio.sleep(min(delay * (0.5 + random.random() / 2), left))
        delay = min(delay * 2, max_s)


_REMEDY = (
    "check that the Temporal server is running and reachable (`wfe dev temporal`, "
    "WFE_TEMPORAL_ADDRESS), then retry: runs already started are kept and go on once it is back"
)


def unavailable(exc: RPCError, address: str | None, what: str) -> DriverUnavailableError:
    """The error a client call raises when Temporal is down, restarting or overloaded (an
    ``UNREACHABLE`` status): what failed and what to do, never temporalio's raw ``RPCError``."""
    status = getattr(status_of(exc), "name", "?")
    where = f" at {address}" if address else ""
    return DriverUnavailableError(
        f"Temporal{where} did not answer {what} ({status}: {exc.message}); {_REMEDY}"
    )


def silent(address: str | None, what: str) -> DriverUnavailableError:
    """The error a call with a deadline of the caller's raises when Temporal did not answer
    by then (still retrying: down, restarting or overloaded)."""
    where = f" at {address}" if address else ""
    return DriverUnavailableError(f"Temporal{where} did not answer {what}; {_REMEDY}")


class _Engine(Protocol):
    settings: EngineSettings


S = TypeVar("S", bound=_Engine)


def surfaced(
    what: str,
) -> Callable[
    [Callable[Concatenate[S, P], Coroutine[Any, Any, T]]],
    Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
]:
    """Decorates a client method of the engine: an ``UNREACHABLE`` ``RPCError`` that escapes
    it (Temporal down or restarting) reaches the caller as ``DriverUnavailableError``."""

    def decorate(
        fn: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
    ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
        @functools.wraps(fn)
        async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return await fn(self, *args, **kwargs)
            except RPCError as exc:
                if status_of(exc) not in UNREACHABLE:
                    raise
                raise unavailable(exc, self.settings.temporal_address, what) from None

        return wrapper

    return decorate


def grpc_compression(mode: str, address: str) -> GrpcCompression:
    """The connection's gRPC compression for ``EngineSettings.temporal_grpc_compression``:
    "auto" is none for a loopback address (``localhost``, ``127.0.0.0/8``, ``[::1]``), where
    gzip costs CPU on both ends for no bandwidth saved, and gzip (temporalio's default)
    elsewhere."""
    if mode == "auto":
        host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:  # a host name
            loopback = False
        mode = "none" if loopback else "gzip"
    return GrpcCompression.NONE if mode == "none" else GrpcCompression.GZIP
