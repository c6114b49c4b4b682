"""``python -m bench.tools.pg_replay [--runs N]``: how much of a native PostgreSQL run is its SQL
and its round trips, what no change to the engine's Python can go below (the PostgreSQL half of
``sql_replay``).

Runs N 3-stage no-op runs (in-process worker) on a fresh database, unrecorded, for the
engine's p50; then copies the database (``CREATE DATABASE ... TEMPLATE``, the engine stopped)
and records, with the engine started again, every query N more runs send, exactly as psycopg
got it: the multi-statement texts of ``_pgbatch`` (BEGIN, ``EXECUTE`` of the prepared
statements, COMMIT) and the statements sent on their own, with their parameters, each on the
connection it went to. Then replays them in order with bare psycopg on the copy (one
connection per connection of the engine, no SQLAlchemy, no asyncio, nothing between two
round trips): the same statements, transactions and round trips, so the same server work.
Then the same without the reads (each text's SELECTs left out, a text left with no write sent
with the next: a lower bound of a worker that kept the state of the runs it leases and only
wrote) on a second copy. Prints the engine's p50, the replay's p50 (its SQL and round trips
alone), the writes' p50, the PostgreSQL
server's CPU per run of each, and the raw floor's 3-stage run (``bench/_floor.py``, five
one-row transactions) in another fresh database.

Issue 12 asks for a PostgreSQL latency at least 3x DBOS's and at most 3x the floor's; the
replay says how far down the engine's statements would let it go."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import psycopg

from engine_port import EngineSettings, create_engine

from .. import _common
from .. import _workflows as W
from .._common import fresh_postgres_db
from .._floor import Conn, one_run
from .txcount import _postgres_cpu

Query = tuple[int, Any, Any, bool]  # connection, query, parameters, executemany
_SEP = b"\n;\n"  # (between the statements of a ``_pgbatch`` text)


class _Recorder:
    """Every query psycopg's (sync) cursors send while ``on``, per run."""

    def __init__(self) -> None:
        self.on = False
        self.runs: list[list[Query]] = []
        self.prepares: dict[int, list[bytes]] = {}  # per connection, before the recording
        # prepared statements that only read (connection, name: each connection names its own)
        self.selects: set[tuple[int, bytes]] = set()

    def install(self) -> Any:
        orig_execute, orig_many = psycopg.Cursor.execute, psycopg.Cursor.executemany
        recorder = self

        def execute(self: Any, query: Any, params: Any = None, **k: Any) -> Any:
            recorder.seen(id(self.connection), query, params, False)
            return orig_execute(self, query, params, **k)

        def executemany(self: Any, query: Any, params_seq: Any, **k: Any) -> Any:
            params_seq = list(params_seq)
            recorder.seen(id(self.connection), query, params_seq, True)
            return orig_many(self, query, params_seq, **k)

        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]

        def uninstall() -> None:
            psycopg.Cursor.execute = orig_execute  # type: ignore[method-assign]
            psycopg.Cursor.executemany = orig_many  # type: ignore[method-assign]

        return uninstall

    def seen(self, conn: int, query: Any, params: Any, many: bool) -> None:
        if isinstance(query, bytes) and b"PREPARE " in query:
            prepares = [p for p in query.split(_SEP) if p.startswith(b"PREPARE")]
            for prepare in prepares:
                name, _, sql = prepare[len(b"PREPARE ") :].partition(b" AS ")
                if sql.lstrip().upper().startswith(b"SELECT"):
                    self.selects.add((conn, name))
            if not self.on:
                # (prepared on this connection before the recording: the replay's connection
                # prepares it first, untimed)
                self.prepares.setdefault(conn, []).extend(prepares)
        if self.on:
            self.runs[-1].append((conn, query, params, many))

    def writes(self) -> list[list[Query]]:
        """Each run's queries without their reads (a lower bound of a worker that kept the
        state of the runs it leases): the SELECTs left out of each multi-statement text, a
        text left with nothing to write (BEGIN, reads) sent with its connection's next one."""
        out = []
        for run in self.runs:
            kept: list[Query] = []
            ahead: dict[int, list[bytes]] = {}
            for conn, query, params, many in run:
                if not isinstance(query, bytes) or params is not None:
                    if not str(query).lstrip().upper().startswith("SELECT"):
                        kept.append((conn, query, params, many))
                    continue
                parts = [p for p in query.split(_SEP) if not self._reads(conn, p)]
                parts = ahead.pop(conn, []) + parts
                if any(p != b"BEGIN" and not p.startswith(b"PREPARE") for p in parts):
                    kept.append((conn, _SEP.join(parts), None, False))
                elif parts:
                    ahead[conn] = parts
            out.append(kept)
        return out

    def _reads(self, conn: int, part: bytes) -> bool:
        if part.startswith(b"EXECUTE "):
            return (conn, part[len(b"EXECUTE ") :].partition(b"(")[0]) in self.selects
        return part.lstrip().upper().startswith(b"SELECT")


async def _engine_runs(
    url: str, runs: int, recorder: _Recorder | None
) -> tuple[list[float], float]:
    """``runs`` timed runs after 20 warm-ups, and the server's CPU per run (measured with the
    engine's connections still open: a closed backend's CPU leaves /proc with it); with a
    recorder, each run's queries recorded."""
    with tempfile.TemporaryDirectory() as blobs:
        settings = EngineSettings(database_url=url, blob_url=f"file://{blobs}")
        async with create_engine(settings, W.registry()) as engine, engine.worker():
            for _ in range(20):
                await engine.wait((await engine.start("bench-seq3", {})).id, timeout=60)
            await asyncio.sleep(0.3)
            samples = []
            server0 = _postgres_cpu()
            for _ in range(runs):
                if recorder is not None:
                    recorder.runs.append([])
                    recorder.on = True
                t0 = time.perf_counter()
                await engine.wait((await engine.start("bench-seq3", {})).id, timeout=60)
                samples.append(time.perf_counter() - t0)
            server = (_postgres_cpu() - server0) / runs
            await asyncio.sleep(0.3)
            if recorder is not None:
                recorder.on = False
    return samples, server


def _copy(url: str, suffix: str) -> str:
    """A copy of the database at ``url`` (nobody connected to it), as a psycopg URL."""
    name = url.rsplit("/", 1)[1]
    copy = f"{name}_{suffix}"
    with psycopg.connect(_common.PG_ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"')
    return f"{_common.PG_ADMIN.rsplit('/', 1)[0]}/{copy}"


def _drop(url: str) -> None:
    with psycopg.connect(_common.PG_ADMIN, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def _counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Rows per table of the engine, and its completed runs."""
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'wfe%'"
        )
    ]
    counts = {t: int(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in tables}  # type: ignore[index]
    row = conn.execute("SELECT count(*) FROM wfe_runs WHERE status = 'completed'").fetchone()
    counts["completed runs"] = int(row[0]) if row else 0
    return counts


def _replay(
    url: str, recorder: _Recorder, runs: list[list[Query]]
) -> tuple[list[float], float, dict[str, int]]:
    """Each recorded run's queries with bare psycopg on ``url``: the time of each run, the
    server's CPU per run and what the replay added to each table and to the completed runs
    (as much as the engine, if it did the engine's work)."""
    conns: dict[int, psycopg.Connection[Any]] = {}

    def conn_for(key: int) -> psycopg.Connection[Any]:
        conn = conns.get(key)
        if conn is None:
            conn = conns[key] = psycopg.connect(url, autocommit=True, prepare_threshold=None)
            for prepare in recorder.prepares.get(key, []):
                conn.execute(prepare)
        return conn

    cursors: dict[int, Any] = {}
    for run in runs:  # (connected and prepared before the clock starts)
        for key, *_ in run:
            cursors.setdefault(key, conn_for(key).cursor())
    samples = []
    check = conn_for(0)
    before = _counts(check)
    server0 = _postgres_cpu()
    try:
        for run in runs:
            t0 = time.perf_counter()
            for key, query, params, many in run:
                cur = cursors[key]
                if many:
                    cur.executemany(query, params)
                else:
                    cur.execute(query, params)
                    while True:  # (every result of a multi-statement text read, as the engine)
                        if cur.pgresult is not None and cur.description is not None:
                            cur.fetchall()
                        if not cur.nextset():
                            break
            samples.append(time.perf_counter() - t0)
        server = (_postgres_cpu() - server0) / len(runs)
        after = _counts(check)
        return samples, server, {k: n - before.get(k, 0) for k, n in after.items()}
    finally:
        for conn in conns.values():
            conn.close()


def _floor(runs: int) -> tuple[list[float], float]:
    with fresh_postgres_db("replay_floor") as url:
        conn = Conn("postgres", url)
        try:
            conn.setup()
            samples = []
            for i in range(runs + 20):
                if i == 20:
                    server0 = _postgres_cpu()
                t0 = time.perf_counter()
                one_run(conn, 3)
                if i >= 20:
                    samples.append(time.perf_counter() - t0)
            return samples, (_postgres_cpu() - server0) / runs
        finally:
            conn.close()


def _without(url: str, indexes: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for name in indexes:
            c.execute(f'DROP INDEX "{name}"')


def main(runs: int, drop_index: list[str]) -> None:
    recorder = _Recorder()
    dropped = f"without {len(drop_index)} index(es)"
    with fresh_postgres_db("replay") as plain:
        url = plain.replace("postgresql://", "postgresql+psycopg://", 1)
        engine, engine_server = asyncio.run(_engine_runs(url, runs, None))
        copies = [_copy(plain, "replay"), _copy(plain, "writes")]
        if drop_index:
            copies.append(_copy(plain, "noidx"))
            _without(copies[2], drop_index)
        try:
            uninstall = recorder.install()
            try:
                asyncio.run(_engine_runs(url, runs, recorder))
            finally:
                uninstall()
            replayed, replay_server, added = _replay(copies[0], recorder, recorder.runs)
            writes = recorder.writes()
            written, writes_server, added_writes = _replay(copies[1], recorder, writes)
            if drop_index:
                bare, bare_server, _ = _replay(copies[2], recorder, recorder.runs)
        finally:
            for copy in copies:
                _drop(copy)
    floor, floor_server = _floor(runs)
    queries = [len(r) for r in recorder.runs]
    sets = {"engine": engine, "its SQL replayed": replayed, "its writes alone": written}
    servers = {
        "engine": engine_server,
        "its SQL replayed": replay_server,
        "its writes alone": writes_server,
        "raw floor": floor_server,
    }
    if drop_index:
        sets[dropped], servers[dropped] = bare, bare_server
    sets["raw floor"] = floor
    p50 = {k: statistics.median(v) * 1000 for k, v in sets.items()}
    print(f"postgres: {runs} runs of bench-seq3, in-process worker")
    print(
        f"  recorded per run: {statistics.mean(queries):.1f} queries (round trips), "
        f"{statistics.mean(len(r) for r in writes):.1f} with writes; of the {runs} runs, the "
        f"replay completed {added['completed runs']}, the writes alone "
        f"{added_writes['completed runs']}; the writes alone added the replay's rows to every "
        f"table: {'yes' if added_writes == added else f'NO ({added_writes} != {added})'}"
    )
    for what, ms in p50.items():
        print(
            f"  {what:<24}p50 {ms:.3f} ms ({ms / p50['raw floor']:.2f}x the floor's), "
            f"server CPU {servers[what] * 1000:.2f} ms/run"
        )
    print(
        "  (the replay: the engine's queries as psycopg got them, in order, on one bare psycopg "
        "connection per engine connection; its writes alone: the same without the SELECTs, "
        "a lower bound of a worker that kept its runs' state; server CPU: every postgres "
        "process of this host)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument(
        "--drop-index",
        action="append",
        default=[],
        help="replay the SQL once more on a copy without this index (repeatable)",
    )
    args = ap.parse_args()
    main(args.runs, args.drop_index)
