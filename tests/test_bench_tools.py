"""The profiling tools of ``bench/tools`` that the bench README's conclusions rest on must run:
``sql_replay`` replays what the engine sent, including what a busy SQLite makes it send twice;
``pg_replay`` does the engine's PostgreSQL work again; ``txcount`` says what a run writes;
``timer_lateness`` says how late a durable timer or a retry fires; ``pg_statements`` and
``pg_writes`` say what each statement costs the PostgreSQL server and what a run writes to
each table and index."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from bench import _common
from bench.tools import pg_replay, pg_statements, pg_writes, sql_replay, timer_lateness, txcount
from tests.support.databases import admin_url


def test_a_begin_tried_again_after_busy_is_replayed_once(tmp_path: Path) -> None:
    # A BEGIN IMMEDIATE that met a checkpoint holding the database is sent again on the
    # database thread: the recording then holds it twice in one transaction.
    db = tmp_path / "snap.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    recorded = [
        [
            ("BEGIN IMMEDIATE", None, False),
            ("BEGIN IMMEDIATE", None, False),
            ("INSERT INTO t (k, v) VALUES (?, ?)", (1, "a"), False),
            ("SELECT v FROM t WHERE k = ?", (1,), False),
            ("COMMIT", None, False),
        ]
    ]
    samples = sql_replay._replay(db, recorded, [])
    assert len(samples) == 1
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT k, v FROM t").fetchall() == [(1, "a")]


@pytest.mark.timeout(120)
def test_sql_replay_prints_each_line(capsys: pytest.CaptureFixture[str]) -> None:
    sql_replay.main(runs=5, drop=[])
    out = capsys.readouterr().out
    for line in ("engine", "its SQL replayed", "its writes, shaped", "raw floor"):
        assert f"  {line} " in out


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_pg_replay_does_the_engines_work_again(
    pg_session: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The replay's time is a lower bound of the engine's only if it does the same work: every
    # recorded run completes again in the copy of the database.
    monkeypatch.setattr(_common, "PG_ADMIN", admin_url().replace("+psycopg", "", 1))
    pg_replay.main(runs=5, drop_index=["ix_wfe_runs_status_created"])
    out = capsys.readouterr().out
    assert "of the 5 runs, the replay completed 5, the writes alone 5" in out
    assert "the writes alone added the replay's rows to every table: yes" in out
    for line in ("engine", "its SQL replayed", "its writes alone", "without 1 index", "raw floor"):
        assert f"  {line}" in out


def test_pg_replay_tells_reads_from_writes_per_connection() -> None:
    # Each connection numbers its prepared statements from wfe_0: one connection's wfe_0 may
    # read while another's writes. The writes alone keep the second's (they were dropped
    # when the names were taken for the same statement on every connection).
    rec = pg_replay._Recorder()
    rec.seen(1, b"PREPARE wfe_0 AS SELECT 1\n;\nBEGIN\n;\nEXECUTE wfe_0( 1)", None, False)
    rec.seen(
        2, b"PREPARE wfe_0 AS UPDATE t SET v = $1\n;\nBEGIN\n;\nEXECUTE wfe_0( 1)", None, False
    )
    rec.on = True
    rec.runs.append([])
    rec.seen(1, b"BEGIN\n;\nEXECUTE wfe_0( 2)", None, False)
    rec.seen(1, b"COMMIT", None, False)
    rec.seen(2, b"BEGIN\n;\nEXECUTE wfe_0( 3)\n;\nCOMMIT", None, False)
    assert rec.writes() == [
        [
            (1, b"BEGIN\n;\nCOMMIT", None, False),
            (2, b"BEGIN\n;\nEXECUTE wfe_0( 3)\n;\nCOMMIT", None, False),
        ]
    ]


@pytest.fixture
def hooks_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """txcount wraps these for its counters: put back after the test, as they were."""
    import psycopg

    from driver_native._db import Database
    from driver_native._pgloop import LoopConnection

    for owner, name in [
        (Database, "_tx_once"),
        (Database, "_read_once"),
        (LoopConnection, "wait"),
        (psycopg.Cursor, "execute"),
        (psycopg.Pipeline, "__exit__"),
        (psycopg.Connection, "commit"),
        (psycopg.Connection, "rollback"),
    ]:
        monkeypatch.setattr(owner, name, getattr(owner, name))


def _written_kib(out: str) -> float:
    line = next(x for x in out.splitlines() if x.strip().startswith("written/run"))
    return float(line.split()[1])


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("hooks_restored")
def test_txcount_says_what_a_sqlite_run_writes(capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(txcount.main("sqlite", 5))
    assert _written_kib(capsys.readouterr().out) > 0


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("hooks_restored")
def test_txcount_says_how_much_wal_a_postgres_run_writes(
    pg_session: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_common, "PG_ADMIN", admin_url().replace("+psycopg", "", 1))
    # (the host's postgres processes' CPU counts 10 ms clock ticks: five quick runs on a quiet
    # host may not move it, which hid the backends' own count, in nanoseconds)
    monkeypatch.setattr(txcount, "_postgres_cpu", lambda: 0.0)
    asyncio.run(txcount.main("postgres", 5))
    out = capsys.readouterr().out
    assert _written_kib(out) > 0
    assert "  backends CPU/run " in out  # (this database's backends alone)


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_pg_statements_explains_each_statement_of_a_run(
    pg_session: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_common, "PG_ADMIN", admin_url().replace("+psycopg", "", 1))
    pg_statements.main(runs=3)
    out = capsys.readouterr().out
    # (per run: how often, executor ms, ...): a run's row is inserted once
    insert = next(x.split() for x in out.splitlines() if "  INSERT INTO wfe_runs [" in x)
    assert float(insert[0]) == 1.0
    assert "  total: exec " in out


def test_pg_statements_names_a_statement_by_its_verb_and_table() -> None:
    assert pg_statements._label(b"INSERT INTO wfe_runs (id) VALUES ($1)") == "INSERT INTO wfe_runs"
    cte = b"WITH taken AS \n(UPDATE wfe_runs SET status=$1 ...) INSERT INTO wfe_outbox (a) SELECT"
    assert pg_statements._label(cte) == "UPDATE wfe_runs SET status.. + INSERT INTO wfe_outbox"


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_pg_writes_counts_the_rows_a_run_writes(
    pg_session: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # (the WAL per relation only where pg_waldump may read the server's WAL: not asserted)
    monkeypatch.setattr(_common, "PG_ADMIN", admin_url().replace("+psycopg", "", 1))
    pg_writes.main(runs=3, workflow="bench-seq3")
    out = capsys.readouterr().out
    runs_row = next(x.split() for x in out.splitlines() if x.strip().startswith("wfe_runs "))
    assert float(runs_row[1]) >= 1.0  # (rows inserted a run: the run's row at least)


def test_ab_swap_takes_the_base_version_and_puts_the_new_one_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``ab_swap`` compiles the named functions as they are at the base commit and swaps them
    in for side A only (a classmethod stays one), then runs both sides and prints B/A."""
    from bench.tools import ab_swap
    from driver_native import _schedule

    new_plan = _schedule.Ahead.__dict__["plan"]
    swaps = [
        ab_swap.Swap("driver_native/_schedule.py:Ahead.plan", "HEAD"),
        ab_swap.Swap("driver_native/_schedule.py:upstream_outputs", "HEAD"),
    ]
    assert isinstance(swaps[0].old, classmethod) and swaps[0].old is not new_plan
    assert swaps[1].old.__globals__ is not vars(_schedule)  # (a copy of its globals)
    out = asyncio.run(ab_swap.measure("sqlite", swaps, batches=2, per=2, aa=False))
    assert _schedule.Ahead.__dict__["plan"] is new_plan  # (side B's left in place)
    assert [len(out[s][1]) for s in "AB"] == [4, 4]
    ab_swap.report(out, print)
    assert "B/A: CPU a run" in capsys.readouterr().out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("retry", [False, True])
def test_timer_lateness_prints_its_percentiles(
    retry: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(timer_lateness.main(["sqlite"], runs=2, delay_ms=20.0, poll=5.0, retry=retry))
    out = capsys.readouterr().out
    assert ("retry delay 20 ms" if retry else "ctx.step.sleep 20 ms") in out
    for line in ("resume - due", "run latency - D"):
        assert f"  {line} " in out
