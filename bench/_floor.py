"""The raw floor: the same journal rows the workloads need, written with bare sqlite3 /
psycopg, one transaction per row, no engine at all.

A 3-stage run is 5 transactions (insert the run, one row per stage, mark the run done);
fan-out is 1 + width + 1 stage rows plus the run's two; the long stage is one row per step;
a signal round trip is 3 (record the signal, complete the waiting step, complete the run).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ._common import Sizes, fresh_postgres_db, guarded, step_growth, summary_ms

__all__ = ["run_floor"]

DDL = [
    "CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, status TEXT NOT NULL, "
    "created_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS steps (run_id TEXT NOT NULL, name TEXT NOT NULL, "
    "result TEXT, PRIMARY KEY (run_id, name))",
]


class Conn:
    """One connection; ``tx(sql, params)`` is one transaction of one statement."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        if backend == "sqlite":
            self.c: Any = sqlite3.connect(url, isolation_level=None, timeout=30)
            self.c.execute("PRAGMA journal_mode=WAL")
            self.c.execute("PRAGMA synchronous=NORMAL")
            self.c.execute("PRAGMA busy_timeout=30000")
        else:
            import psycopg

            self.c = psycopg.connect(url, autocommit=False)

    def setup(self) -> None:
        for ddl in DDL:
            self.c.execute(ddl)
        if self.backend == "postgres":
            self.c.commit()

    def tx(self, sql: str, params: tuple[Any, ...]) -> None:
        if self.backend == "sqlite":
            self.c.execute("BEGIN IMMEDIATE")
            self.c.execute(sql, params)
            self.c.execute("COMMIT")
        else:
            with self.c.transaction():
                self.c.execute(sql.replace("?", "%s"), params)

    def close(self) -> None:
        self.c.close()


INS_RUN = "INSERT INTO runs (id, status, created_at) VALUES (?, 'running', ?)"
INS_STEP = "INSERT INTO steps (run_id, name, result) VALUES (?, ?, ?)"
DONE_RUN = "UPDATE runs SET status = 'completed' WHERE id = ?"


def one_run(c: Conn, stages: int) -> None:
    rid = uuid.uuid4().hex
    c.tx(INS_RUN, (rid, time.time()))
    for i in range(stages):
        c.tx(INS_STEP, (rid, f"s{i}", "1"))
    c.tx(DONE_RUN, (rid,))


def write_runs(backend: str, url: str, runs: int) -> None:
    c = Conn(backend, url)
    try:
        for _ in range(runs):
            one_run(c, 3)
    finally:
        c.close()


def _latency(c: Conn, sizes: Sizes) -> dict[str, Any]:
    samples = []
    for i in range(sizes.warmup + sizes.latency_runs):
        t0 = time.perf_counter()
        one_run(c, 3)
        if i >= sizes.warmup:
            samples.append(time.perf_counter() - t0)
    return summary_ms(samples)


def _fanout(c: Conn, sizes: Sizes) -> dict[str, Any]:
    samples = []
    for _ in range(sizes.fanout_runs):
        t0 = time.perf_counter()
        one_run(c, sizes.fanout_width + 2)
        samples.append(time.perf_counter() - t0)
    out = summary_ms(samples)
    out["width"] = sizes.fanout_width
    return out


def _long(c: Conn, sizes: Sizes) -> dict[str, Any]:
    rid = uuid.uuid4().hex
    c.tx(INS_RUN, (rid, time.time()))
    stamps = []
    for i in range(sizes.long_steps):
        stamps.append(time.perf_counter())
        c.tx(INS_STEP, (rid, f"s{i}", str(i)))
    c.tx(DONE_RUN, (rid,))
    return step_growth(stamps)


def _signal(c: Conn, sizes: Sizes) -> dict[str, Any]:
    samples = []
    for _ in range(sizes.signal_runs):
        rid = uuid.uuid4().hex
        c.tx(INS_RUN, (rid, time.time()))
        t0 = time.perf_counter()
        c.tx(INS_STEP, (rid, "signal:go", '{"ok": true}'))
        c.tx(INS_STEP, (rid, "go", '{"ok": true}'))
        c.tx(DONE_RUN, (rid,))
        samples.append(time.perf_counter() - t0)
    return summary_ms(samples)


def _spawn_writer(args: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench._floor", json.dumps(args)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )


async def _throughput(backend: str, url: str, sizes: Sizes) -> dict[str, Any]:
    n = sizes.throughput_runs
    start_at = time.time() + 1.5
    args = {"backend": backend, "url": url, "runs": n // 2, "start_at": start_at}
    procs = [_spawn_writer(args) for _ in range(2)]
    ends = []
    for p in procs:
        stdout, _ = await asyncio.to_thread(p.communicate, None, 600)
        if p.returncode != 0:
            raise RuntimeError(f"floor writer exited {p.returncode}")
        ends.append(float(stdout.decode().strip().splitlines()[-1]))
    dt = max(ends) - start_at
    total = (n // 2) * 2
    return {"runs_per_s": total / dt, "seconds": dt, "n": total, "workers": 2}


async def run_floor(backend: str, sizes: Sizes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as d:
        if backend == "sqlite":
            await _run_all(out, backend, str(Path(d) / "floor.db"), sizes)
        else:
            with fresh_postgres_db("bench_floor") as url:
                await _run_all(out, backend, url, sizes)
    return out


async def _run_all(out: dict[str, Any], backend: str, url: str, sizes: Sizes) -> None:
    c = Conn(backend, url)
    try:
        c.setup()

        async def sync(fn: Any) -> dict[str, Any]:
            result: dict[str, Any] = fn(c, sizes)
            return result

        await guarded(out, "latency", lambda: sync(_latency))
        await guarded(out, "fanout", lambda: sync(_fanout))
        await guarded(out, "long_stage", lambda: sync(_long))
        await guarded(out, "signal", lambda: sync(_signal))
    finally:
        c.close()
    await guarded(out, "throughput", lambda: _throughput(backend, url, sizes))


def _writer_main() -> None:
    a = json.loads(sys.argv[1])
    c = Conn(a["backend"], a["url"])
    c.close()  # connect once before the start line so both writers start warm
    c = Conn(a["backend"], a["url"])
    time.sleep(max(0.0, a["start_at"] - time.time()))
    c.close()
    write_runs(a["backend"], a["url"], a["runs"])
    print(time.time(), flush=True)
    os._exit(0)


if __name__ == "__main__":
    _writer_main()
