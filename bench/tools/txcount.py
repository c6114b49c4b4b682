"""``python -m bench.tools.txcount [sqlite|postgres] [--runs N] [--signal]``: transactions,
statements and latency per 3-stage no-op run of the native driver (in-process worker), or
with ``--signal`` per ``signal()`` -> completion of a run parked in its wait, counted with a
wrapper around ``Database`` transaction entry points and SQLAlchemy's
``before_cursor_execute`` event, and on PostgreSQL the network round trips (psycopg's
blocking waits outside a pipeline, plus one per pipeline sync), and the CPU the PostgreSQL
server spent per run (its processes on this host) beside the raw floor's 3-stage run
(``bench/_floor.py``) in the same database; and what a run writes (PostgreSQL: WAL bytes;
SQLite: the bytes this process wrote, WAL frames and checkpoints). Prints the per-run
averages and the busiest transaction functions."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections import Counter
from typing import Any

from sqlalchemy import event

from driver_native._db import Database
from engine_port import EngineSettings, create_engine

from .. import _workflows as W
from .._common import native_database
from .._floor import Conn, one_run


class Counts:
    def __init__(self) -> None:
        self.tx: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.statements = 0
        self.round_trips = 0
        # CPU of the database threads inside transactions and reads, and the part of it (and
        # the wall time) spent inside psycopg's waits (sending, polling, reading results)
        self.db_cpu = 0.0
        self.wait_cpu = 0.0
        self.wait_wall = 0.0
        self.waits = 0

    def reset(self) -> None:
        # (in place: the wrappers installed by _install hold these counters)
        tx, reads = self.tx, self.reads
        self.__init__()  # type: ignore[misc]
        tx.clear()
        reads.clear()
        self.tx, self.reads = tx, reads

    # --signal: only what happens between mark() and unmark() is kept
    def mark(self) -> None:
        self._at = (Counter(self.tx), Counter(self.reads), self.statements, self.round_trips)

    def unmark(self) -> None:
        tx, reads, statements, trips = self._at
        kept = getattr(self, "_kept", (Counter(), Counter(), 0, 0))
        self._kept = (
            kept[0] + (self.tx - tx),
            kept[1] + (self.reads - reads),
            kept[2] + self.statements - statements,
            kept[3] + self.round_trips - trips,
        )

    def split(self, runs: int) -> tuple[float, float, float, float]:
        """Per run: database-thread CPU, CPU and wall inside psycopg's waits (ms), waits."""
        ms = 1000 / runs
        return self.db_cpu * ms, self.wait_cpu * ms, self.wait_wall * ms, self.waits / runs

    def take_marked(self) -> None:
        self.tx, self.reads, self.statements, self.round_trips = self._kept


def _install(counts: Counts) -> None:
    orig_once, orig_read = Database._tx_once, Database._read_once

    def timed(orig: Any, seen: Counter[str]) -> Any:
        def once(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
            seen[getattr(fn, "__qualname__", repr(fn))] += 1
            cpu = time.thread_time()
            try:
                return orig(self, attempt, fn, *a, **k)
            finally:
                counts.db_cpu += time.thread_time() - cpu

        return once

    tx_once, read_once = timed(orig_once, counts.tx), timed(orig_read, counts.reads)

    Database._tx_once = tx_once  # type: ignore[method-assign]
    Database._read_once = read_once  # type: ignore[method-assign]
    try:
        import psycopg
    except ImportError:
        return
    from psycopg.pq import TransactionStatus

    idle = TransactionStatus.IDLE
    orig_execute, orig_exit = psycopg.Cursor.execute, psycopg.Pipeline.__exit__
    orig_commit, orig_rollback = psycopg.Connection.commit, psycopg.Connection.rollback

    def execute(self: Any, *a: Any, **k: Any) -> Any:
        conn = self.connection
        if conn._pipeline is None:  # (inside a pipeline a statement is only queued)
            counts.round_trips += 1
            if not conn.autocommit and conn.info.transaction_status == idle:
                counts.round_trips += 1  # psycopg's implicit BEGIN, sent on its own
        return orig_execute(self, *a, **k)

    def pipeline_exit(self: Any, *a: Any) -> Any:
        counts.round_trips += 1  # the sync: every queued statement's result comes back
        return orig_exit(self, *a)

    def ending(orig: Any) -> Any:
        def end(self: Any) -> Any:
            if self.info.transaction_status != idle:
                counts.round_trips += 1
            return orig(self)

        return end

    from driver_native._pgloop import LoopConnection

    def timed_wait(orig_wait: Any) -> Any:
        def wait(self: Any, *a: Any, **k: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return orig_wait(self, *a, **k)
            finally:
                counts.waits += 1
                counts.wait_cpu += time.thread_time() - cpu
                counts.wait_wall += time.perf_counter() - wall

        return wait

    # (the engine's connections are all LoopConnections)
    LoopConnection.wait = timed_wait(LoopConnection.wait)  # type: ignore[method-assign]
    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    psycopg.Pipeline.__exit__ = pipeline_exit  # type: ignore[method-assign]
    psycopg.Connection.commit = ending(orig_commit)  # type: ignore[method-assign]
    psycopg.Connection.rollback = ending(orig_rollback)  # type: ignore[method-assign]


def _postgres_cpu() -> float:
    """User + system CPU seconds of every ``postgres`` process of this host (0 when the server
    runs elsewhere): backends, WAL writer, checkpointer."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if name.startswith("postgres"):
            fields = rest.split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _backend_cpu(url: str, conn: Any = None) -> dict[int, float]:
    """CPU seconds of each backend of this database (pid -> seconds, from the scheduler's
    nanosecond count; empty when the server runs elsewhere): unlike :func:`_postgres_cpu`,
    other databases' clients (a test suite beside the benchmark) do not count; the WAL writer
    and the checkpointer do not either. ``conn``: a connection to ask (not counted); else
    one is opened."""
    import psycopg

    if conn is None:
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as own:
            return _backend_cpu(url, own)
    pids = [
        int(r[0])
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
    ]
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                out[pid] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


def _backends_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _written(backend: str, url: str) -> int | None:
    """Bytes written so far: PostgreSQL's WAL insert position, or on SQLite what this
    process wrote (``wchar`` of ``/proc/self/io``: the WAL frames and the checkpoints that
    copy them back); None where neither can be read."""
    if backend == "postgres":
        import psycopg

        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        return None if row is None else int(row[0])
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return None


def _floor_server_cpu(url: str, runs: int) -> tuple[float, float]:
    """The PostgreSQL server's CPU per 3-stage run of the raw floor, in the same database:
    every postgres process's, and its backend's."""
    conn = Conn("postgres", url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        conn.setup()
        for _ in range(20):
            one_run(conn, 3)
        server0, backends0 = _postgres_cpu(), _backend_cpu(url)
        for _ in range(runs):
            one_run(conn, 3)
        server, backends = _postgres_cpu() - server0, _backends_delta(backends0, _backend_cpu(url))
        return server / runs, backends / runs
    finally:
        conn.close()


async def _one_signal(engine: Any, counts: Counts) -> float:
    """A run parked in its signal wait (not counted), then ``signal()`` -> run complete."""
    run = await engine.start("bench-signal", {})
    for _ in range(3000):
        info = await engine.get_run(run.id)
        if info.stages and info.stages[0].status == "suspended":
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # (let the worker go idle)
    counts.mark()
    t0 = time.perf_counter()
    await engine.signal(run.id, "go", {"ok": True})
    await engine.wait(run.id, timeout=60)
    counts.unmark()
    return time.perf_counter() - t0


async def _measure(
    engine: Any, counts: Counts, backend: str, url: str, runs: int, signal: bool
) -> tuple[list[float], float, tuple[float, float], int | None]:
    """``runs`` runs (or signals) counted: their latencies, this process's and the server's
    CPU per run, and the bytes they wrote (None: not readable here)."""
    samples = []
    postgres = backend == "postgres"
    cpu0, server0 = time.process_time(), _postgres_cpu()
    backends0 = _backend_cpu(url) if postgres else {}
    written0 = _written(backend, url)
    for _ in range(runs):
        if signal:
            samples.append(await _one_signal(engine, counts))
            continue
        t0 = time.perf_counter()
        run = await engine.start("bench-seq3", {})
        await engine.wait(run.id, timeout=60)
        samples.append(time.perf_counter() - t0)
    cpu = (time.process_time() - cpu0) / runs
    server = (_postgres_cpu() - server0) / runs
    own = _backends_delta(backends0, _backend_cpu(url)) / runs if postgres else 0.0
    await asyncio.sleep(0.3)  # (the outbox flush of the last runs)
    written1 = _written(backend, url)
    written = None if written0 is None or written1 is None else written1 - written0
    return samples, cpu, (server, own), written


async def main(backend: str, runs: int, signal: bool = False) -> None:
    counts = Counts()
    _install(counts)
    with native_database(backend) as url, tempfile.TemporaryDirectory() as blobs:
        settings = EngineSettings(database_url=url, blob_url=f"file://{blobs}")
        async with create_engine(settings, W.registry()) as engine:
            db = engine.kernel.db  # type: ignore[attr-defined]

            def stmt(*_a: Any) -> None:
                counts.statements += 1

            event.listen(db.engine, "before_cursor_execute", stmt)
            async with engine.worker():
                for _ in range(5):
                    await engine.wait((await engine.start("bench-seq3", {})).id, timeout=60)
                await asyncio.sleep(0.3)
                counts.reset()
                samples, cpu, server, written = await _measure(
                    engine, counts, backend, url, runs, signal
                )
                if signal:
                    counts.take_marked()
                tx, reads, statements = Counter(counts.tx), Counter(counts.reads), counts.statements
                round_trips, split = counts.round_trips, counts.split(runs)
            floor = (
                _floor_server_cpu(url, runs) if backend == "postgres" and not signal else (0.0, 0.0)
            )
    what = "signal() -> run complete of bench-signal" if signal else "runs of bench-seq3"
    print(f"{backend}: {runs} {what}, in-process worker")
    print(f"  p50 latency      {statistics.median(samples) * 1000:.2f} ms")
    if not signal:  # (with --signal it includes starting and parking the run)
        print(f"  CPU/run          {cpu * 1000:.2f} ms (this process, all threads)")
    print(f"  transactions/run {sum(tx.values()) / runs:.2f}")
    print(f"  autocommit reads/run {sum(reads.values()) / runs:.2f}")
    print(f"  statements/run   {statements / runs:.1f} (incl. BEGIN on SQLite)")
    if written is not None and not signal:
        kind = "WAL" if backend == "postgres" else "this process's writes: WAL, checkpoints"
        print(f"  written/run      {written / runs / 1024:.1f} KiB ({kind})")
    if backend == "postgres":
        print(f"  round trips/run  {round_trips / runs:.1f} (BEGIN and COMMIT included)")
        # (both 0: the server runs elsewhere. The first counts clock ticks, 10 ms: a few quick
        # runs may not move it; the backends' count is in nanoseconds)
        if (server[0] or server[1]) and not signal:
            print(
                f"  server CPU/run   {server[0] * 1000:.2f} ms, the raw floor's "
                f"{floor[0] * 1000:.2f} ms (every postgres process of this host: other "
                "clients count too)"
            )
            print(
                f"  backends CPU/run {server[1] * 1000:.2f} ms, the raw floor's "
                f"{floor[1] * 1000:.2f} ms (this database's backends only)"
            )
        if not signal:
            db_cpu, wait_cpu, wait_wall, waits = split
            print(
                f"  CPU inside transactions/run {db_cpu:.2f} ms, "
                f"of it in psycopg's waits {wait_cpu:.2f} ms (on the loop: with what the loop "
                "ran while a transaction waited)"
            )
            print(
                f"  psycopg waits/run {waits:.1f}, their wall {wait_wall:.2f} ms "
                "(server, network, fsync and that CPU)"
            )
    for name, n in (tx + reads).most_common(12):
        print(f"    {n / runs:6.2f}  {name}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("backend", choices=["sqlite", "postgres"], nargs="?", default="sqlite")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument(
        "--signal", action="store_true", help="count signal() -> run complete instead of a run"
    )
    args = ap.parse_args()
    asyncio.run(main(args.backend, args.runs, args.signal))
