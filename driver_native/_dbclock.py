"""The time of a host as the database tells it.

Every host of a PostgreSQL deployment writes times the others compare with their own: when a
timer or a retry is due (``jobs.available_at``), a sleep's or a wait's deadline (the step
ledger), a run's timeout (``runs.deadline``). Leases already compare against the database's
clock in SQL; these are written and compared by the hosts. A host whose wall clock runs ahead
would fire every timer and retry early (and time runs out early), one running behind would
leave the work others made due waiting for as long as it is behind, and a timer it set would
fire that much late elsewhere.

:class:`DatabaseClock` wraps the system clock of the engine: ``now()`` is the host's wall
clock plus its offset from the database's, measured when the engine connects and again every
:data:`RESYNC_SECONDS` by a worker. So the database's clock decides, as on Temporal (the
server's timers) whatever the clock of the host. Offsets under :data:`TOLERANCE_SECONDS` are
left alone (a measure is only as good as half its round trip; hosts synced by NTP are
milliseconds apart); a larger one is corrected and logged once, with what to do about it.
SQLite is one host: its engines keep their clock, as does an engine given a clock of its own
(a ``FakeClock`` in tests)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port.driver import Clock

from ._sql import db_clock_sql

if TYPE_CHECKING:
    from ._db import Database

__all__ = ["RESYNC_SECONDS", "TOLERANCE_SECONDS", "DatabaseClock"]

log = logging.getLogger("driver_native")

TOLERANCE_SECONDS = 1.0
RESYNC_SECONDS = 30.0
_SAMPLES = 3


def _sample(conn: Connection, clock: Clock, n: int) -> tuple[float, float]:
    """(offset, round trip) of the database's clock against ``clock``: of ``n`` reads, the
    one with the shortest round trip (the others waited on a busy host or server)."""
    stmt = sa.select(db_clock_sql())
    best: tuple[float, float] | None = None
    for _ in range(n):
        before = clock.now().timestamp()
        server = float(conn.execute(stmt).scalar_one())
        after = clock.now().timestamp()
        trip = after - before
        if best is None or trip < best[1]:
            best = (server - (before + after) / 2, trip)
    assert best is not None
    return best


class DatabaseClock:
    """``inner`` (the host's wall clock) shifted by its offset from the database's clock."""

    def __init__(self, inner: Clock) -> None:
        self.inner = inner
        self.offset = 0.0  # seconds added to the host's clock (0: within the tolerance)
        self._synced_at: float | None = None  # (monotonic)

    def now(self) -> datetime:
        now = self.inner.now()
        return now + timedelta(seconds=self.offset) if self.offset else now

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)

    def due(self) -> bool:
        """Whether the offset was last measured :data:`RESYNC_SECONDS` ago or more."""
        return self._synced_at is None or time.monotonic() - self._synced_at >= RESYNC_SECONDS

    async def sync(self, db: Database) -> None:
        """Measure the offset again (off the event loop)."""
        offset, trip = await db.read_long(_sample, self.inner, _SAMPLES)
        self._synced_at = time.monotonic()
        if abs(offset) < TOLERANCE_SECONDS:
            if self.offset:
                log.warning("this host's clock is in step with the database's again")
            self.offset = 0.0
            return
        if abs(offset - self.offset) >= TOLERANCE_SECONDS:  # (said once, not every sync)
            log.warning(
                "this host's clock is %.1fs %s of the database's (measured with a round trip "
                "of %.3fs); the engine goes by the database's time (due timers, retries, "
                "deadlines). Fix this host's time synchronisation (NTP): other programs on "
                "it still see the wrong time",
                abs(offset),
                "behind" if offset > 0 else "ahead",
                trip,
            )
        self.offset = offset
