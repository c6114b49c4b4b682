"""temporalio's core logs while the Temporal server is down: one WARNING an outage, not one
per retried call.

temporalio's Rust core (``temporalio_client::retry``) logs a WARN for every gRPC call it keeps
retrying: each poller of each worker, 1-2 lines a second for as long as the server is away
(``gRPC call poll_workflow_task_queue retried 7 times error=Status { code: Unavailable,
message: "tcp connect error", ... }``), printed by the core itself to stderr, past Python's
logging. temporalio has no setting for that one message, so before its first client connects
the driver makes the process's default temporalio ``Runtime`` (``use_runtime``) with the
same levels (core WARN, the rest ERROR) but its core logs *forwarded* to the Python logger
``wfe.temporal.core`` (so ``wfe worker --log-format json`` and the program's logging config
apply to them too), where ``OutageFilter`` drops the retry WARNs of status ``Unavailable``
(the server down, restarting or unreachable), ``Unknown: transport error`` or a
``Cancelled`` of a transport error (its connections cut as it stops) and logs in their place
one WARNING on ``wfe.temporal`` when the first one comes ("Temporal does not answer ...;
retrying until it is back") and one INFO once Temporal answers again (a worker asks every
``PROBE_EVERY_S`` meanwhile; a describe or a retried call that gets an answer says so too).
Every other core message (another status, another target, an ERROR) goes through as it is.

A program that set temporalio's default runtime itself (``Runtime.set_default``, for its
metrics say) keeps it and its logging: add ``OUTAGE`` as a filter to the logger it forwards
core logs to for the same effect.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["CORE_LOGGER", "OUTAGE", "PROBE_EVERY_S", "OutageFilter", "probe", "use_runtime"]

CORE_LOGGER = "wfe.temporal.core"
"""Where temporalio's core logs go (``use_runtime``)."""
PROBE_EVERY_S = 1.0
"""How often a worker asks whether Temporal answers again, during an outage."""

log = logging.getLogger("wfe.temporal")

# "[sdk_core::temporalio_client::retry] gRPC call poll_activity_task_queue retried 6 times
# {'error': 'Status { code: Unavailable, message: "tcp connect error", ... }'}"
_RETRIED = re.compile(r"gRPC call (\w+) retried \d+ times")
# the server down or restarting: refused ("tcp connect error"), or its connections cut
# ("Unknown: transport error", ConnectionReset; "Cancelled: operation was canceled" from a
# tonic transport error, "connection closed", as a restart closes a long poll)
_UNAVAILABLE = re.compile(r'code: (Unavailable|Unknown|Cancelled), message: "([^"]*)"')
_TARGET = re.compile(r"ConnectError\(\"[^\"]*\", ([^,)\s]+)")


class OutageFilter(logging.Filter):
    """Drops temporalio core's retry WARNs of an unavailable server; logs one WARNING when
    the first comes and one INFO when Temporal answers again (``answered``)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()  # (core logs arrive on temporalio's threads too)
        self.since: float | None = None  # when the current outage began (None: no outage)
        self.outages = 0  # outages noticed since the process started

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        retried = _RETRIED.search(message)
        status = _UNAVAILABLE.search(message) if retried else None
        if (
            retried is None
            or status is None
            or (status.group(1) == "Unknown" and "transport error" not in status.group(2))
            or (status.group(1) == "Cancelled" and "tonic::transport::Error" not in message)
        ):
            return True  # anything else: as it is
        with self._lock:
            if self.since is not None:
                return False
            self.since = time.monotonic()
            self.outages += 1
        target = _TARGET.search(message)
        where = f" at {target.group(1)}" if target else ""
        log.warning(
            "Temporal%s does not answer (%s: %s: %s); workers and calls keep retrying until it "
            "is back (their retries are not logged)",
            where,
            retried.group(1),
            status.group(1),
            status.group(2),
        )
        return False

    def answered(self) -> None:
        """Temporal answered a call: the outage, if one was noticed, is over."""
        if self.since is None:
            return
        with self._lock:
            since, self.since = self.since, None
        if since is not None:
            log.info("Temporal answers again (unavailable for %.1fs)", time.monotonic() - since)


OUTAGE = OutageFilter()
"""The process's filter (one: the core runtime is the process's)."""


@functools.cache  # (once a process)
def use_runtime() -> None:
    """Before the driver's first client connects: make temporalio's default runtime one whose
    core logs reach ``CORE_LOGGER`` through ``OUTAGE``, unless the program made its own."""
    logging.getLogger(CORE_LOGGER).addFilter(OUTAGE)
    import temporalio.runtime

    ref = getattr(temporalio.runtime, "_runtime_ref", None)
    if ref is not None and (
        getattr(ref, "_default_runtime", None) is not None
        or getattr(ref, "_prevent_default", False)
    ):
        return  # the program's runtime, or its choice to pass one explicitly
    runtime = Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(
                    logger=logging.getLogger(CORE_LOGGER), append_target_to_name=False
                ),
            )
        )
    )
    with contextlib.suppress(RuntimeError):  # (made meanwhile: the program's)
        Runtime.set_default(runtime, error_if_already_set=True)


async def probe(client: Client) -> None:
    """During an outage noticed: whether Temporal answers again (logs the INFO if so)."""
    if OUTAGE.since is None:
        return
    try:
        await client.service_client.check_health(timeout=timedelta(seconds=2))
    except Exception:
        return
    OUTAGE.answered()
