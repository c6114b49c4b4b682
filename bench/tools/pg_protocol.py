"""``python -m bench.tools.pg_protocol [--runs N]``: what one transaction of the native
driver's shape costs on PostgreSQL with each way psycopg can send it, in one process.

The shape is a stage outcome's: two reads (the run row ``FOR UPDATE`` and a stage row), then
three writes and the COMMIT. Sent three ways on one connection, alternated:

- ``plain``: one statement per round trip (server-side prepared after psycopg's threshold);
- ``pipelined``: reads in one pipeline (with the BEGIN), writes with the COMMIT in another
  (what ``driver_native._db`` does: 2 round trips);
- ``multi-statement``: reads and writes each as one simple-protocol query with the values
  bound client-side (``psycopg.ClientCursor``): 2 round trips, no pipeline mode.

Prints per transaction the wall time, this thread's CPU (``time.thread_time``) and the
server backend's CPU (``/proc/<backend pid>/stat``, 10 ms ticks: read it over many runs),
and the fixed costs of a pipeline and of SQLAlchemy's pool checkout. The point: on loopback a
pipeline saves network waits but costs client CPU per statement (bench/README.md, "2026-12-01
late"); which protocol wins depends on the cores the client and the server share."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.types.json import Jsonb

from .._common import fresh_postgres_db

_READS = (
    "SELECT id, v, n, j FROM wfe_shape WHERE id = %s FOR UPDATE",
    "SELECT id, v FROM wfe_shape WHERE id = %s",
)
_WRITES = (
    "UPDATE wfe_shape SET n = n + 1 WHERE id = %s",
    "UPDATE wfe_shape SET v = %s, j = %s WHERE id = %s",
    "UPDATE wfe_shape SET v = %s WHERE id = %s",
)


def _write_params() -> tuple[tuple[Any, ...], ...]:
    return ((1,), ("y", Jsonb({"status": "completed"}), 2), ("z", 3))


class _Meter:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._stat = f"/proc/{conn.info.backend_pid}/stat"
        self._tick = os.sysconf("SC_CLK_TCK")

    def server_cpu(self) -> float:
        if not os.path.exists(self._stat):  # (the connection is closed: client-only timing)
            return 0.0
        with open(self._stat) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick

    def measure(self, fn: Callable[[], Any], runs: int) -> tuple[float, float, float]:
        """(wall, client CPU, server CPU) per call, in microseconds."""
        for _ in range(max(10, runs // 20)):
            fn()
        wall, cpu, server = time.perf_counter(), time.thread_time(), self.server_cpu()
        for _ in range(runs):
            fn()
        us = 1e6 / runs
        return (
            (time.perf_counter() - wall) * us,
            (time.thread_time() - cpu) * us,
            (self.server_cpu() - server) * us,
        )


def _ways(conn: psycopg.Connection[Any]) -> dict[str, Callable[[], Any]]:
    cur = conn.cursor()
    client = psycopg.ClientCursor(conn)

    def plain() -> None:
        for sql, key in zip(_READS, (1, 2), strict=True):
            cur.execute(sql, (key,))
            cur.fetchall()
        for sql, params in zip(_WRITES, _write_params(), strict=True):
            cur.execute(sql, params)
        conn.commit()

    def pipelined() -> None:
        first, second = conn.cursor(), conn.cursor()
        with conn.pipeline():
            first.execute(_READS[0], (1,))
            second.execute(_READS[1], (2,))
        first.fetchall()
        second.fetchall()
        with conn.pipeline():
            for sql, params in zip(_WRITES, _write_params(), strict=True):
                cur.execute(sql, params)
            conn.commit()

    def multi() -> None:
        client.execute("BEGIN;" + ";".join(_READS), (1, 2))
        while True:
            if client.description:
                client.fetchall()
            if not client.nextset():
                break
        client.execute(";".join(_WRITES) + ";COMMIT", tuple(v for p in _write_params() for v in p))

    return {"plain": plain, "pipelined": pipelined, "multi-statement": multi}


def main(runs: int) -> None:
    with fresh_postgres_db() as url:
        with psycopg.connect(url, autocommit=True) as setup:
            setup.execute("CREATE TABLE wfe_shape (id int PRIMARY KEY, v text, n int, j jsonb)")
            setup.execute(
                "INSERT INTO wfe_shape SELECT g, 'x', 0, '{}' FROM generate_series(1, 10) g"
            )
        with psycopg.connect(url) as conn:
            meter = _Meter(conn)
            ways = _ways(conn)
            print(
                "one outcome-shaped transaction (2 reads, 3 writes, COMMIT), "
                f"{runs} runs, x2 alternated"
            )
            print(f"{'way':18s} {'wall us':>9s} {'client CPU us':>14s} {'server CPU us':>14s}")
            for _ in range(2):
                for name, fn in ways.items():
                    conn.autocommit = name == "multi-statement"  # (it sends its own BEGIN)
                    wall, cpu, server = meter.measure(fn, runs)
                    print(f"{name:18s} {wall:9.1f} {cpu:14.1f} {server:14.1f}")
            conn.autocommit = False

            def empty_pipeline() -> None:
                with conn.pipeline():
                    pass

            wall, cpu, _ = meter.measure(empty_pipeline, runs)
            print(
                f"an empty pipeline (enter, sync, exit): wall {wall:.1f} us, "
                f"client CPU {cpu:.1f} us"
            )
        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:

            def begin() -> None:
                with engine.begin():
                    pass

            wall, cpu, _ = meter.measure(begin, runs)
            print(f"SQLAlchemy engine.begin() with no statement: client CPU {cpu:.1f} us")
        finally:
            engine.dispose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=600)
    main(ap.parse_args().runs)
