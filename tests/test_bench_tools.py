"""The profiling tools of ``bench/tools`` that the bench README's conclusions rest on must run:
``sql_replay`` replays what the engine sent, including what a busy SQLite makes it send twice."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bench.tools import sql_replay


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
