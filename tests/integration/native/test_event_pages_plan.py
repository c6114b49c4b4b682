"""A page of a run's events (``engine.events(run_id, after_seq=, limit=)``) is a range read of
the outbox's (run id, seq) index, ``ix_wfe_outbox_run``, on SQLite and PostgreSQL: it starts at
``after_seq`` and stops after ``limit`` rows, however many events the run and the outbox hold,
never a sort of the run's events nor a scan of the outbox.

Measured on 2026-12-06 at 50,000 events of one run (400-byte data each), under tracemalloc on a
loaded 2-vCPU host: ``events(run_id)`` 7.8 s and a 90 MB peak on SQLite (11.8 s, 129 MB on
PostgreSQL); a page of 1,000 after seq 49,000 0.19 s and 1.6 MB (0.18 s, 2.4 MB); the whole
page loop of 1,000 a page 2.3 s (4.4 s)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from driver_native import _outbox

from .conftest import MakeEngine

RUNS, PER_RUN = 20, 1000


async def _pile_up(engine: Any) -> None:
    """``RUNS`` made-up runs of ``PER_RUN`` delivered events each (seq 1..PER_RUN)."""

    def insert(conn: sa.Connection) -> None:
        conn.execute(
            sa.text(
                "INSERT INTO wfe_outbox (event_id, run_id, workflow_id, seq, type, data,"
                " business, created_at, status, attempts)"
                " WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :n)"
                " SELECT 'pile-' || i, 'pile-run-' || (i / :per), 'pile', i % :per + 1,"
                " 'run.created', CAST('{}' AS JSON), FALSE, 0.0, 'delivered', 1 FROM g"
            ),
            {"n": RUNS * PER_RUN - 1, "per": PER_RUN},
        )

    await engine.kernel.db.tx(insert)


async def test_a_page_of_events_reads_the_run_index_from_after_seq(
    make_engine: MakeEngine, database_url: str
) -> None:
    engine = await make_engine()
    await _pile_up(engine)
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "wfe_outbox" in statement and statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, params))

    def page_and_plan(conn: sa.Connection) -> tuple[list[int], list[str]]:
        sa.event.listen(conn, "before_cursor_execute", record)
        try:
            page = _outbox.load_events(conn, "pile-run-7", 900, 50)
        finally:
            sa.event.remove(conn, "before_cursor_execute", record)
        ((sql, params),) = seen
        if conn.dialect.name == "sqlite":
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params).all()
            return [e.seq for e in page], [r[-1] for r in rows]
        conn.execute(sa.text("ANALYZE wfe_outbox"))
        rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE) {sql}", params).all()
        return [e.seq for e in page], [r[0] for r in rows]

    seqs, plan = await engine.kernel.db.tx(page_and_plan)
    assert seqs == list(range(901, 951))
    text = "\n".join(plan)
    if database_url.startswith("sqlite"):
        assert plan == ["SEARCH wfe_outbox USING INDEX ix_wfe_outbox_run (run_id=? AND seq>?)"], (
            plan
        )
    else:
        assert "Index Scan using ix_wfe_outbox_run" in text, text
        assert "Index Cond:" in text and "seq >" in text, text
        for not_wanted in ("Seq Scan", "Sort", "Rows Removed by Filter"):
            assert not_wanted not in text, text
