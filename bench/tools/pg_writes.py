"""``python -m bench.tools.pg_writes [--runs N] [--workflow NAME]``: what a native PostgreSQL
run writes, per table and per index: N 3-stage no-op runs (in-process worker) on a fresh
database, then the WAL they wrote read back with ``pg_waldump`` (records and bytes per
relation, full-page images apart) and the table counters' deltas (rows inserted, updated, of
them HOT, deleted).

Needs ``pg_waldump`` and read access to the server's ``pg_wal`` (the server on this host, run
as a user who may read its data directory); without them only the counters are printed. The
WAL of other databases written meanwhile is left out (records name their database); records
of no relation (commits, for one) are counted apart. Nothing of the server is changed."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg

from engine_port import EngineSettings, create_engine

from .. import _workflows as W
from .._common import native_database

_REL = re.compile(r"rel (\d+)/(\d+)/(\d+)")
_LEN = re.compile(r"len \(rec/tot\):\s*(\d+)/\s*(\d+)")
_DESC = re.compile(r"desc: (\S+)")
_RMGR = re.compile(r"rmgr: (\S+)")
_FPW = re.compile(r"FPW")

_TABLE_COUNTERS = "n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"


def _counters(conn: Any) -> dict[str, tuple[int, ...]]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        f"SELECT relname, {_TABLE_COUNTERS} FROM pg_stat_user_tables WHERE relname LIKE 'wfe_%'"
    ).fetchall()
    return {r[0]: tuple(int(x) for x in r[1:]) for r in rows}


def _relations(conn: Any) -> dict[int, str]:
    rows = conn.execute(
        "SELECT pg_relation_filenode(c.oid), c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "AND pg_relation_filenode(c.oid) IS NOT NULL"
    ).fetchall()
    names = {int(r[0]): str(r[1]) for r in rows}
    toast = conn.execute(
        "SELECT pg_relation_filenode(c.reltoastrelid), c.relname FROM pg_class c "
        "WHERE c.reltoastrelid <> 0 AND c.relname LIKE 'wfe_%'"
    ).fetchall()
    for node, name in toast:
        if node is not None:
            names[int(node)] = f"{name} (toast)"
    return names


def _pg_waldump() -> str | None:
    found = shutil.which("pg_waldump")
    for version in ("17", "16", "15", "14", "13"):
        path = f"/usr/lib/postgresql/{version}/bin/pg_waldump"
        if found is None and os.path.exists(path):
            found = path
    return found


Tally = dict[str, Counter[str]]


def _waldump(start: str, end: str, dboid: int, names: dict[int, str]) -> tuple[Tally, Counter[str]]:
    """The WAL between ``start`` and ``end`` of the database ``dboid`` (and the records of no
    relation): per relation (records, bytes, full-page images and their bytes) and per
    record kind (bytes). Empty when ``pg_waldump`` is missing or cannot read the WAL
    (``PGWAL``: the server's ``pg_wal`` folder, when not the tool's default)."""
    per: Tally = defaultdict(Counter)
    kinds: Counter[str] = Counter()
    tool = _pg_waldump()
    if tool is None:
        print("  (no pg_waldump: WAL per relation not read)")
        return per, kinds
    args = [tool, "-s", start, "-e", end]
    if os.environ.get("PGWAL"):
        args += ["-p", os.environ["PGWAL"]]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode != 0 and not out.stdout:
        print(f"  (pg_waldump failed: {out.stderr.strip()[:200]})")
        return per, kinds
    for line in out.stdout.splitlines():
        length = _LEN.search(line)
        if length is None:
            continue
        tot = int(length.group(2))
        rel, rmgr, desc = _REL.search(line), _RMGR.search(line), _DESC.search(line)
        what = f"{rmgr.group(1) if rmgr else '?'}/{desc.group(1) if desc else '?'}"
        if rel is not None and int(rel.group(2)) != dboid:
            continue  # (another database's)
        name = (
            "(no relation: any database's)"
            if rel is None
            else names.get(int(rel.group(3)), rel.group(3))
        )
        row = per[name]
        row["bytes"] += tot
        row["records"] += 1
        if _FPW.search(line):
            row["fpi"] += 1
            row["fpi_bytes"] += tot - int(length.group(1))
        kinds[what] += tot
    return per, kinds


def _one(conn: Any, sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


async def _runs(url: str, runs: int, workflow: str) -> tuple[int, dict[str, Any], float]:
    """``runs`` runs after 20 warm-ups, from a checkpoint: the database's oid, the table
    counters and the WAL position before them, and their time."""
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with tempfile.TemporaryDirectory() as blobs:
        settings = EngineSettings(database_url=url, blob_url=f"file://{blobs}")
        async with create_engine(settings, W.registry()) as engine, engine.worker():
            for _ in range(20):
                await engine.wait((await engine.start(workflow, {})).id, timeout=60)
            await asyncio.sleep(1.5)
            with psycopg.connect(plain, autocommit=True) as conn:
                dboid = int(
                    _one(conn, "SELECT oid FROM pg_database WHERE datname = current_database()")
                )
                conn.execute("CHECKPOINT")  # (FPIs: each page's first change after it)
                before = {
                    "counters": _counters(conn),
                    "lsn": str(_one(conn, "SELECT pg_current_wal_insert_lsn()")),
                }
            t0 = time.perf_counter()
            for _ in range(runs):
                await engine.wait((await engine.start(workflow, {})).id, timeout=60)
            took = time.perf_counter() - t0
            await asyncio.sleep(1.5)  # (the backends' counters flushed, the outbox's flushes)
    return dboid, before, took


def main(runs: int, workflow: str) -> None:
    with native_database("postgres") as url:
        dboid, before, took = asyncio.run(_runs(url, runs, workflow))
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            end = str(_one(conn, "SELECT pg_current_wal_insert_lsn()"))
            after = _counters(conn)
            names = _relations(conn)
            total = int(
                _one(conn, "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, before["lsn"]))
            )
    print(
        f"postgres: {runs} runs of {workflow} in {took:.1f} s; WAL {total / runs / 1024:.2f} "
        "KiB/run (every database's, from a checkpoint)"
    )
    print("  rows per run:          inserted updated    HOT  deleted")
    for name in sorted(after):
        was = before["counters"].get(name, (0, 0, 0, 0))
        d = [(a - b) / runs for a, b in zip(after[name], was, strict=True)]
        if any(d):
            print(f"  {name:22s}" + "".join(f"{x:9.2f}" for x in d))
    per, kinds = _waldump(before["lsn"], end, dboid, names)
    if not per:
        return
    print("  WAL per run by relation: records, bytes (of them full-page images: count, bytes)")
    for name, row in sorted(per.items(), key=lambda kv: -kv[1]["bytes"]):
        print(
            f"  {name:34s}{row['records'] / runs:7.2f}{row['bytes'] / runs:9.0f} B"
            f"   fpi {row['fpi'] / runs:5.2f} {row['fpi_bytes'] / runs:7.0f} B"
        )
    print("  WAL per run by record kind (bytes)")
    for what, n in kinds.most_common(25):
        print(f"  {what:34s}{n / runs:9.0f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--workflow", default="bench-seq3")
    args = ap.parse_args()
    main(args.runs, args.workflow)
