"""``python -m bench.tools.sql_replay [--runs N] [--drop-index NAME ...]``: how much of a native
SQLite run is its SQL. Runs N 3-stage no-op runs (in-process worker) and records every statement
the engine sends, with its parameters, and every commit; then replays them, in order, with bare
``sqlite3`` (no engine, no SQLAlchemy, no asyncio) on a snapshot of the database taken just before
the recorded runs, so every row, id and index page is what the engine saw. Prints the engine's
p50 per run, the replay's p50 per run (the same statements and commits: the SQL's own cost), and
the raw floor's 3-stage run on the same machine (five one-row transactions, ``bench/_floor.py``)
for the ratios of issue 12's "10x the floor" goal.

Then a lower bound for the engine's shape: the same writes (its reads left out, as a worker
that kept the state of the runs it leases would), each run handed from the caller to one worker
task through an ``asyncio.Queue`` and its result back through a future, a coroutine awaited per
stage: what the run would cost with nothing of the engine's Python around its SQL.

``--drop-index`` drops an index from the snapshot before the replay (what the index costs the
run's transactions; the statements stay the same)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from engine_port import EngineSettings, create_engine

from .. import _workflows as W
from .._floor import Conn, one_run

Statement = tuple[str, Any, bool]  # SQL, parameters, executemany


async def _record(folder: Path, runs: int) -> tuple[list[list[Statement]], list[float], Path]:
    """N runs of the engine: each run's statements (commits as ``COMMIT``) and its latency,
    and the snapshot of the database taken before them."""
    settings = EngineSettings(
        database_url=f"sqlite:///{folder}/wfe.db", blob_url=f"file://{folder}/blobs"
    )
    recorded: list[list[Statement]] = []
    samples: list[float] = []
    snapshot = folder / "snapshot.db"
    async with create_engine(settings, W.registry()) as engine:
        db = engine.kernel.db  # type: ignore[attr-defined]
        current: list[Statement] = []

        def statement(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
            current.append((sql, params, many))

        def commit(_conn: Any) -> None:
            current.append(("COMMIT", None, False))

        async with engine.worker():
            for _ in range(20):
                await engine.wait((await engine.start("bench-seq3", {})).id, timeout=60)
            for _ in range(runs):  # the engine's p50 as the bench measures it: not recorded
                t0 = time.perf_counter()
                await engine.wait((await engine.start("bench-seq3", {})).id, timeout=60)
                samples.append(time.perf_counter() - t0)
            await asyncio.sleep(0.3)  # (the worker idle: nothing in flight)
            with sqlite3.connect(folder / "wfe.db") as src, sqlite3.connect(snapshot) as dst:
                src.backup(dst)
            event.listen(db.engine, "before_cursor_execute", statement)
            event.listen(db.engine, "commit", commit)
            for _ in range(runs):
                current = []  # (a run's last writes may land in the next run's list)
                await engine.wait((await engine.start("bench-seq3", {})).id, timeout=60)
                recorded.append(current)
            await asyncio.sleep(0.3)
    return recorded, samples, snapshot


def _connect(snapshot: Path, drop: list[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(snapshot, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for name in drop:
        conn.execute(f'DROP INDEX "{name}"')
    return conn


def _play(conn: sqlite3.Connection, statements: list[Statement], *, reads: bool) -> None:
    cur = conn.cursor()
    for sql, params, many in statements:
        if sql == "COMMIT":
            conn.commit()
        elif sql == "BEGIN IMMEDIATE" and conn.in_transaction:
            continue  # (a BEGIN that found the database busy, tried again on its thread)
        elif not reads and sql.lstrip().startswith("SELECT"):
            continue
        elif many:
            cur.executemany(sql, params)
        else:
            cur.execute(sql, params or ())
            if cur.description is not None:
                cur.fetchall()


def _replay(snapshot: Path, recorded: list[list[Statement]], drop: list[str]) -> list[float]:
    """Replay each run's statements with bare sqlite3; the time of each run."""
    conn = _connect(snapshot, drop)
    samples = []
    for statements in recorded:
        t0 = time.perf_counter()
        _play(conn, statements, reads=True)
        samples.append(time.perf_counter() - t0)
    conn.close()
    return samples


def _transactions(statements: list[Statement]) -> list[list[Statement]]:
    out: list[list[Statement]] = [[]]
    for s in statements:
        out[-1].append(s)
        if s[0] == "COMMIT":
            out.append([])
    return [t for t in out if t]


async def _shape(snapshot: Path, recorded: list[list[Statement]], drop: list[str]) -> list[float]:
    """Each run's writes in the smallest engine shape: the caller commits the first
    transaction and hands the run to a worker task, which awaits a no-op stage before each
    further transaction and resolves the caller's future."""
    conn = _connect(snapshot, drop)
    queue: asyncio.Queue[tuple[list[list[Statement]], asyncio.Future[Any]]] = asyncio.Queue()

    async def stage(value: Any) -> Any:
        return {"ok": value}

    async def worker() -> None:
        while True:
            txs, done = await queue.get()
            out = None
            for tx in txs[1:]:
                out = await stage(out)
                _play(conn, tx, reads=False)
            done.set_result(out)

    task = asyncio.create_task(worker())
    loop = asyncio.get_running_loop()
    samples = []
    for statements in recorded:
        t0 = time.perf_counter()
        txs = _transactions(statements)
        _play(conn, txs[0], reads=False)
        done = loop.create_future()
        queue.put_nowait((txs, done))
        await done
        samples.append(time.perf_counter() - t0)
    task.cancel()
    conn.close()
    return samples


def _floor(folder: Path, runs: int) -> list[float]:
    conn = Conn("sqlite", str(folder / "floor.db"))
    conn.setup()
    samples = []
    try:
        for i in range(runs + 20):
            t0 = time.perf_counter()
            one_run(conn, 3)
            if i >= 20:
                samples.append(time.perf_counter() - t0)
    finally:
        conn.close()
    return samples


def main(runs: int, drop: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        recorded, engine, snapshot = asyncio.run(_record(folder, runs))
        pristine = folder / "pristine.db"
        shutil.copy(snapshot, pristine)
        replayed = _replay(snapshot, recorded, drop)
        shaped = asyncio.run(_shape(pristine, recorded, drop))
        floor = _floor(folder, runs)
    per_run = [len(r) for r in recorded]
    commits = [sum(1 for s in r if s[0] == "COMMIT") for r in recorded]
    sets = {"e": engine, "r": replayed, "s": shaped, "f": floor}
    p50 = {k: statistics.median(v) * 1000 for k, v in sets.items()}
    mean = {k: statistics.mean(v) * 1000 for k, v in sets.items()}
    print(f"sqlite: {runs} runs of bench-seq3, in-process worker")
    print(
        f"  recorded per run: {statistics.mean(per_run):.1f} statements "
        f"({statistics.mean(commits):.2f} commits)"
    )
    for key, what in (
        ("e", "engine"),
        ("r", "its SQL replayed"),
        ("s", "its writes, shaped"),
        ("f", "raw floor"),
    ):
        print(
            f"  {what:<19}p50 {p50[key]:.3f} ms ({p50[key] / p50['f']:.1f}x the floor's), "
            f"mean {mean[key]:.3f} ms ({mean[key] / mean['f']:.1f}x)"
        )
    print(
        "  (the replay: the same statements and commits, with bare sqlite3"
        + (f", without {', '.join(drop)})" if drop else ")")
    )
    print(
        "  (shaped: its writes without its reads, in one worker task fed by a queue, a no-op "
        "coroutine per stage, a future per run: a lower bound of the engine's shape)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--drop-index", action="append", default=[], metavar="NAME")
    args = ap.parse_args()
    main(args.runs, args.drop_index)
