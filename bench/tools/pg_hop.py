"""``python -m bench.tools.pg_hop [--runs N]``: what running a PostgreSQL transaction off the
event loop costs, against running it on the loop, in one process.

One transaction of the native driver's shape on the wire (two round trips of the simple query
protocol: BEGIN with a read, then a write with the COMMIT), three ways, alternated:

- ``hop``: a sync psycopg connection, the transaction run by ``loop.run_in_executor`` on a
  database thread (what ``driver_native._db.Database.tx`` does on PostgreSQL);
- ``async``: a ``psycopg.AsyncConnection``, the transaction awaited on the loop (its waits are
  the loop's: nothing else is blocked);
- ``inline``: the sync connection called on the loop's own thread (blocks the loop for the
  transaction's round trips; for comparison only: an engine cannot do this safely, see
  bench/README.md, 2026-12-02).

Prints per transaction the wall time and this process's CPU (``time.process_time``)."""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from .._common import fresh_postgres_db

_FIRST = "BEGIN;\nSELECT 1, 'a', 2.5"
_LAST = "SELECT 2;\nCOMMIT"


def _sync(conn: Any) -> None:
    cur = conn.cursor()
    cur.execute(_FIRST)
    cur.nextset()
    cur.fetchall()
    cur.execute(_LAST)


async def _async(conn: Any) -> None:
    cur = conn.cursor()
    await cur.execute(_FIRST)
    cur.nextset()
    await cur.fetchall()
    await cur.execute(_LAST)


async def main(runs: int, rounds: int) -> None:
    with fresh_postgres_db() as url:
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(1, thread_name_prefix="wfe-db")
        sync = psycopg.connect(url, autocommit=True)
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            for r in range(rounds):
                for way in ("hop", "async", "inline"):
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(runs):
                        if way == "hop":
                            await loop.run_in_executor(pool, _sync, sync)
                        elif way == "async":
                            await _async(conn)
                        else:
                            _sync(sync)
                    wall = (time.perf_counter() - t0) / runs * 1e6
                    cpu = (time.process_time() - c0) / runs * 1e6
                    print(f"round {r + 1}  {way:6s}  wall {wall:7.1f} us  CPU {cpu:7.1f} us")
        finally:
            sync.close()
            await conn.close()
            pool.shutdown()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.rounds))
