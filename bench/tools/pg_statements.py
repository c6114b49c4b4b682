"""``python -m bench.tools.pg_statements [--runs N]``: what each statement of a native
PostgreSQL run costs the server (issue 12: where the server's time goes, on a server without
``pg_stat_statements``).

Records every query N 3-stage no-op runs send (as ``pg_replay`` does: the multi-statement texts
of ``_pgbatch``, each on its connection), then replays them in order on a copy of the database
taken before them, one statement at a time, each wrapped in ``EXPLAIN (ANALYZE, BUFFERS, WAL,
TIMING OFF)``, in the transactions they were sent in. Prints per run and per statement (the
prepared statement's SQL, shortened): how often it ran, its executor time (the server's
``Execution Time``: no parsing, no round trip), the time EXPLAIN reports for getting its plan
(a cached generic plan's checks and locks), the WAL it wrote (bytes, records, full-page images),
the buffers it touched and dirtied, and how often the server planned it generically or for its
values; then the COMMITs (their WAL flush) timed from the client. EXPLAIN's own overhead is in
the times: compare them with each other, not with the engine's latency."""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import defaultdict
from typing import Any

import psycopg

from .._common import fresh_postgres_db
from .pg_replay import _SEP, _copy, _drop, _engine_runs, _Recorder

_EXEC = re.compile(r"Execution Time: ([\d.]+) ms")
_PLAN = re.compile(r"Planning Time: ([\d.]+) ms")
_WAL = re.compile(r"WAL: (.*)")
_BUF = re.compile(r"Buffers: (.*)")

Stats = dict[str, dict[str, float]]


def _numbers(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+(?: \w+)?)=(\d+)", text)}


def _label(sql: bytes) -> str:
    """A short name of a statement: its verb and table (a run update and the events inserted
    with it in one statement: both)."""
    text = " ".join(sql.decode().split())
    m = re.match(r"WITH taken AS \(UPDATE wfe_runs SET (\S+?)=.*?INSERT INTO wfe_outbox", text)
    if m:
        return f"UPDATE wfe_runs SET {m.group(1)}.. + INSERT INTO wfe_outbox"
    m = re.match(
        r"(INSERT INTO \S+|UPDATE \S+ SET \S+?=|DELETE FROM \S+|SELECT .{0,40}?FROM \S+)", text
    )
    return (m.group(1) if m else text[:60])[:80]


class _Replay:
    """The recorded queries replayed on ``url``, one connection per engine connection."""

    def __init__(self, url: str, recorder: _Recorder) -> None:
        self.url, self.recorder = url, recorder
        self.conns: dict[int, psycopg.Connection[Any]] = {}
        self.names: dict[tuple[int, bytes], bytes] = {}  # (connection, name) -> SQL
        self.stats: Stats = defaultdict(lambda: defaultdict(float))
        self.commits, self.commit_s = 0, 0.0

    def conn(self, key: int) -> psycopg.Connection[Any]:
        conn = self.conns.get(key)
        if conn is None:
            conn = self.conns[key] = psycopg.connect(self.url, autocommit=True)
            for prepare in self.recorder.prepares.get(key, []):
                self.prepare(key, conn, prepare)
        return conn

    def prepare(self, key: int, conn: psycopg.Connection[Any], prepare: bytes) -> None:
        conn.execute(prepare)
        name, _, sql = prepare[len(b"PREPARE ") :].partition(b" AS ")
        self.names[(key, name)] = sql

    def query(self, key: int, query: Any, params: Any, many: bool) -> None:
        conn = self.conn(key)
        if not isinstance(query, bytes) or params is not None or many:
            text = query if isinstance(query, bytes) else str(query).encode()
            (conn.cursor().executemany if many else conn.execute)(query, params)
            self.stats[_label(text) + " (not explained)"]["n"] += 1
            return
        for part in query.split(_SEP):
            if part.startswith(b"PREPARE"):
                self.prepare(key, conn, part)
            elif part in (b"BEGIN", b"COMMIT"):
                t0 = time.perf_counter()
                conn.execute(part)
                if part == b"COMMIT":
                    self.commits += 1
                    self.commit_s += time.perf_counter() - t0
            else:
                self.explain(key, conn, part)

    def explain(self, key: int, conn: psycopg.Connection[Any], part: bytes) -> None:
        if part.startswith(b"EXECUTE "):
            label = _label(self.names[(key, part[len(b"EXECUTE ") :].partition(b"(")[0])])
        else:
            label = _label(part)
        explain = b"EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF) " + part
        plan = "\n".join(str(r[0]) for r in conn.execute(explain).fetchall())
        s = self.stats[label]
        s["n"] += 1
        took = _EXEC.search(plan)
        s["exec"] += float(took.group(1)) if took else 0.0
        planned = _PLAN.search(plan)
        s["plan"] += float(planned.group(1)) if planned else 0.0
        wal = _numbers(m.group(1)) if (m := _WAL.search(plan)) else {}
        s["wal records"] += wal.get("records", 0)
        s["wal fpi"] += wal.get("fpi", 0)
        s["wal bytes"] += wal.get("bytes", 0)
        buffers = _numbers(m.group(1)) if (m := _BUF.search(plan)) else {}
        s["bufs"] += buffers.get("shared hit", 0) + buffers.get("read", 0)
        s["dirtied"] += buffers.get("dirtied", 0)

    def plans(self) -> None:
        """How often each prepared statement was planned generically or for its values."""
        for conn in self.conns.values():
            for statement, generic, custom in conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            ):
                s = self.stats[_label(str(statement).partition(" AS ")[2].encode())]
                s["generic plans"] += generic
                s["custom plans"] += custom

    def run(self) -> None:
        try:
            for run in self.recorder.runs:
                for key, query, params, many in run:
                    self.query(key, query, params, many)
                for conn in self.conns.values():  # (a claim's BEGIN, ended by its next text)
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        conn.execute("COMMIT")
            self.plans()
        finally:
            for conn in self.conns.values():
                conn.close()


def _report(replay: _Replay, runs: int) -> None:
    print(f"postgres: {runs} runs of bench-seq3 replayed statement by statement under EXPLAIN")
    print("  per run:  n  exec ms  plan ms  WAL B  recs  fpi   bufs dirtied  statement")
    total: dict[str, float] = defaultdict(float)
    for label, s in sorted(replay.stats.items(), key=lambda kv: -kv[1]["exec"]):
        if not s["n"]:
            continue
        print(
            f"  {s['n'] / runs:6.2f} {s['exec'] / runs:8.3f} {s['plan'] / runs:8.3f}"
            f" {s['wal bytes'] / runs:6.0f} {s['wal records'] / runs:5.1f}"
            f" {s['wal fpi'] / runs:4.1f} {s['bufs'] / runs:6.1f} {s['dirtied'] / runs:7.1f}"
            f"  {label} [plans: generic {s['generic plans']:.0f}, "
            f"custom {s['custom plans']:.0f}]"
        )
        for k, v in s.items():
            total[k] += v
    print(
        f"  total: exec {total['exec'] / runs:.3f} ms, plan {total['plan'] / runs:.3f} ms, WAL "
        f"{total['wal bytes'] / runs:.0f} B a run; COMMIT {replay.commits / runs:.2f} a run, "
        f"{replay.commit_s / runs * 1000:.3f} ms a run from the client"
    )


def main(runs: int) -> None:
    recorder = _Recorder()
    with fresh_postgres_db("stmts") as plain:
        url = plain.replace("postgresql://", "postgresql+psycopg://", 1)
        asyncio.run(_engine_runs(url, 20, None))
        copy = _copy(plain, "explain")
        try:
            uninstall = recorder.install()
            try:
                asyncio.run(_engine_runs(url, runs, recorder))
            finally:
                uninstall()
            replay = _Replay(copy, recorder)
            replay.run()
        finally:
            _drop(copy)
    _report(replay, runs)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=300)
    main(ap.parse_args().runs)
