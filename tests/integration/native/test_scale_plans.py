"""What the operator calls read on a large database, by their SQLite plans (a planner without
statistics: what it picks does not change with the number of rows, so a small database shows
the plan of a large one).

Measured at 50,000 runs cloned from runs the engine made: a page of the runs of one workflow
or in one status sorted every matching run (0.7 s a page among 48,000, at any depth), a run id
prefix search read every run, and a flush of 500 events of a run with 49,000 delivered ones
read every earlier event of the run for each (16 s, holding SQLite's write lock)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import _outbox
from driver_native._runs import runs_query

from .conftest import MakeEngine


def _plan(conn: sa.Connection, sql: str, params: Any = ()) -> list[str]:
    return [r[-1] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params).all()]


FILTERS: dict[str, dict[str, Any]] = {
    "one status": {"status": ["failed"]},
    "two statuses": {"status": ["pending", "suspended"]},
    "workflow": {"workflow_id": "orders"},
    "workflow and version": {"workflow_id": "orders", "version": "2"},
    "status after a date": {"status": ["completed"], "created_after": 1.0},
}


@pytest.mark.parametrize("deep", [False, True], ids=["first page", "deep page"])
@pytest.mark.parametrize("name", list(FILTERS))
async def test_a_filtered_page_reads_an_index_in_list_order(
    make_engine: MakeEngine, database_url: str, name: str, deep: bool
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's plan (PostgreSQL's depends on its statistics)")
    engine = await make_engine()
    f = dict(FILTERS[name])
    before = (5.0, "r") if deep else None

    def plan(conn: sa.Connection) -> list[str]:
        q = runs_query(
            f.get("workflow_id"),
            f.get("status"),
            51,
            before,
            version=f.get("version"),
            created_after=f.get("created_after"),
            sqlite=True,
        )
        sql = q.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        return _plan(conn, str(sql))

    lines = await engine.kernel.db.read(plan)
    searches = [s for s in lines if "wfe_runs" in s]
    assert searches, lines
    for line in searches:
        # each read of wfe_runs is a search of an index led by the filter, in list order:
        # never a sort of every match (USE TEMP B-TREE right after it) nor a scan
        assert line.startswith("SEARCH wfe_runs USING INDEX ix_wfe_runs_"), lines
        assert "ix_wfe_runs_created " not in line or "status" not in f, lines
    statuses = f.get("status") or []
    for i, line in enumerate(lines):
        if line.startswith("SEARCH wfe_runs") and i + 1 < len(lines):
            # (the merge of several statuses sorts their pages, each at most a page)
            assert not lines[i + 1].startswith("USE TEMP B-TREE"), lines
    if len(statuses) > 1:
        assert len(searches) == len(statuses), lines


async def test_a_run_id_prefix_search_reads_the_matching_ids(
    make_engine: MakeEngine, database_url: str
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's plan (PostgreSQL: the pattern index, test_list_runs)")
    engine = await make_engine()

    def plan(conn: sa.Connection) -> list[str]:
        q = runs_query(None, None, 51, id_prefix="ab12", sqlite=True)
        sql = q.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        return _plan(conn, str(sql))

    lines = await engine.kernel.db.read(plan)
    assert any(
        s.startswith("SEARCH wfe_runs USING INDEX sqlite_autoindex_wfe_runs_1 (id>? AND id<?)")
        for s in lines
    ), lines


async def test_a_flush_looks_only_at_the_held_events_of_a_run(
    make_engine: MakeEngine, database_url: str
) -> None:
    """Before each event it takes, a flush looks for an earlier event of its run that it must
    wait for (claimed by another flush, or waiting for a retry): the partial index of those
    (few), not every earlier event of the run, delivered ones included."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's plan")
    engine = await make_engine()
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "held" in statement:
            seen.append((statement, params))

    def flush_and_plan(conn: sa.Connection) -> list[str]:
        sa.event.listen(conn, "before_cursor_execute", record)
        try:
            _outbox.pending_events(conn, 500, 10.0, "f", 10.0)
        finally:
            sa.event.remove(conn, "before_cursor_execute", record)
        ((sql, params),) = seen
        return _plan(conn, sql, params)

    lines = await engine.kernel.db.tx(flush_and_plan)
    held = [s for s in lines if "held" in s]
    assert held and all("USING INDEX ix_wfe_outbox_held" in s for s in held), lines
