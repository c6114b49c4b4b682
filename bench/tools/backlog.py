"""``python -m bench.tools.backlog [sqlite|postgres] [--rows N]``: what a worker's periodic
looks at the database cost when its tables are big. Fills a fresh database with N rows of
each backlog a real deployment can have (undelivered events where no host has a sink, with
each made-up run's first event failed and waiting an hour for its retry; finished runs, none
old enough to purge; queued jobs of a version nobody here serves), then times, three times
each, the reads and transactions a worker repeats (the outbox gauge, a flush's look for due
events, the look for stuck runs, retention's look, the look for due jobs, the ``/metrics``
gauges) and prints the median. Each of them used to read the whole backlog (bench/README.md,
"2026-12-03 22:29" section); with the indexes of schema v12/v13 they read what they return."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa

from driver_native import PurgeRuns, ReapStuckRuns, _jobs, _outbox, _schema
from engine_port import EngineSettings, create_engine

from .. import _workflows as W
from .._common import native_database

_FILL = [
    # undelivered events, nine per made-up run; each run's first one failed (a sink outage)
    "INSERT INTO wfe_outbox (event_id, run_id, workflow_id, seq, type, data, business,"
    " created_at, status, attempts, next_attempt_at)"
    " WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
    " SELECT 'e-' || i, 'r-' || (i / 9), 'wf', i % 9, 'run.created', CAST('{}' AS JSON), FALSE,"
    " 0.0, 'pending', CASE WHEN i % 9 = 0 THEN 1 ELSE 0 END,"
    " CASE WHEN i % 9 = 0 THEN CAST(:later AS DOUBLE PRECISION) END FROM g",
    # finished runs, the oldest a day old
    "INSERT INTO wfe_runs (id, workflow_id, version, status, current_group, event_seq,"
    " completed_count, redrive_count, cancel_requested, frozen, created_at, updated_at,"
    " finished_at)"
    " WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
    " SELECT 'done-' || i, 'wf', 'v1', 'completed', 0, 0, 0, 0, FALSE, FALSE,"
    " :now - i * 0.08, :now - i * 0.08, :now - i * 0.08 FROM g",
    # the queue of a version nobody here serves
    "INSERT INTO wfe_jobs (run_id, stage_id, kind, wfv, status, available_at, attempt,"
    " created_at)"
    " WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
    " SELECT 'gone-' || i, 'a', 'stage', 'gone@v1', 'ready', 0.0, 1, 0.0 FROM g",
]


async def _median_ms(call: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def main(backend: str, rows: int) -> None:
    with native_database(backend) as url, tempfile.TemporaryDirectory() as blobs:
        settings = EngineSettings(database_url=url, blob_url=f"file://{blobs}")
        async with create_engine(settings, W.registry()) as engine:
            kernel = engine.kernel  # type: ignore[attr-defined]
            db, now = kernel.db, time.time()

            def fill(conn: sa.Connection) -> None:
                for sql in _FILL:
                    conn.execute(sa.text(sql), {"n": rows - 1, "now": now, "later": now + 3600})

            await db.tx(fill)
            if db.is_postgres:
                tables = ", ".join(t.name for t in _schema.metadata.sorted_tables)
                await db.tx(lambda c: c.execute(sa.text(f"ANALYZE {tables}")))
            served = kernel.served()
            looks: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("outbox gauge (stats)", lambda: db.read_long(_outbox.count_outbox)),
                (
                    "flush: look for due events",
                    lambda: db.tx_long(_outbox.pending_events, 100, time.time(), "f", 0.0, 0.0),
                ),
                ("look for stuck runs", lambda: kernel.dispatch(ReapStuckRuns())),
                ("retention 7 days: look", lambda: kernel.dispatch(PurgeRuns(7 * 24 * 3600))),
                ("look for due jobs", lambda: db.read(_jobs.next_due, served)),
                ("/metrics gauges", engine.gauges),  # type: ignore[attr-defined]
            ]
            print(f"{backend}: {rows:,} rows of each backlog, median of 3 (ms)")
            for name, call in looks:
                print(f"  {name:<28} {await _median_ms(call):9.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("backend", nargs="?", default="sqlite", choices=["sqlite", "postgres"])
    ap.add_argument("--rows", type=int, default=200_000)
    args = ap.parse_args()
    asyncio.run(main(args.backend, args.rows))
