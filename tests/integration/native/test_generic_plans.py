"""PostgreSQL plans the guard of a stage's outcome once, on a large database too.

The engine prepares its statements on each connection (``_pgbatch``); PostgreSQL then plans a
statement once (its generic plan) unless its plans for the values given look cheaper. The
guard of a predicted outcome listed stages as ``stage_id = any($array)``: the generic plan
costs an array of unknown length, each custom plan the array given, and on tables without
statistics (this server runs no autovacuum) past a few thousand runs every custom plan looked
cheaper. The guard was planned anew at each outcome, ~0.3 ms of server CPU each (a 3-stage
run on 6,000 runs: 5.7 ms p50, 4.2 once the guard was planned once). The bench's fresh
database never showed it."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native import _progress
from engine_port import StageContext, Workflow

from .conftest import MakeEngine


class In(BaseModel):
    n: int = 0


def _fan() -> Workflow[In]:
    """a, then b1, b2 and b3, then c: outcomes that start one stage or three (a list padded to
    four) and that wait for three."""
    wf = Workflow("plans-fan", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a])
    async def b1(ctx: StageContext[In]) -> int:
        return 2

    @wf.stage(after=[a])
    async def b2(ctx: StageContext[In]) -> int:
        return 3

    @wf.stage(after=[a])
    async def b3(ctx: StageContext[In]) -> int:
        return 4

    @wf.stage(after=[b1, b2, b3])
    async def c(ctx: StageContext[In]) -> int:
        return 5

    return wf


def _grow(conn: sa.Connection, runs: int) -> None:
    """``runs`` completed runs of five stages each, in tables PostgreSQL has no statistics of
    (a server with autovacuum off, as this one, or before its first ANALYZE)."""
    conn.exec_driver_sql(
        "INSERT INTO wfe_runs (id, workflow_id, version, status, current_group, event_seq,"
        " completed_count, redrive_count, cancel_requested, frozen, created_at, updated_at)"
        " SELECT 'old' || i, 'plans-fan', 'v1', 'completed', 3, 14, 5, 0, false, false, i, i"
        f" FROM generate_series(1, {runs}) AS i"
    )
    conn.exec_driver_sql(
        "INSERT INTO wfe_stages (run_id, stage_id, status, attempt, suspensions, output,"
        " has_output, completed_order)"
        " SELECT 'old' || i, s, 'completed', 1, 0, '1', true, 1"
        f" FROM generate_series(1, {runs}) AS i, unnest(ARRAY['a', 'b1', 'b2', 'b3', 'c']) AS s"
    )


def _plans(conn: sa.Connection) -> list[tuple[str, int, int]]:
    """The statements prepared on this connection: (SQL, generic plans, custom plans)."""
    found = []
    for name, generic, custom, text in conn.exec_driver_sql(
        "SELECT name, generic_plans, custom_plans, statement FROM pg_prepared_statements"
    ).all():
        # (``statement``: the whole text sent with the PREPARE, several statements)
        at = text.find(f"PREPARE {name} AS")
        found.append((text[at:].split("\n;\n", 1)[0], generic, custom))
    return found


async def _loop_plans(engine: Any) -> list[tuple[str, int, int]]:
    """:func:`_plans` of each connection the event loop keeps. On a loaded host a caller's
    transaction can overlap the worker's and the loop keeps a second connection (CI beside a
    CPU hog, 2026-12-07: the read took the one that had prepared no guard)."""
    db = engine.kernel.db
    kept = db._loop_conns.idle
    held = list(kept)
    plans: list[tuple[str, int, int]] = []
    try:
        for conn in held:
            kept[:] = [conn]  # (the next read takes this one, and gives it back)
            plans += await db.read(_plans)
    finally:
        kept[:] = held
    return plans


def _guard(sql: str) -> bool:
    """Whether ``sql`` is an outcome's stage guard (it locks the job, reads the stages)."""
    return "FOR SHARE" in sql and "wfe_stages" in sql and "/ CAST(count(*)" in sql


async def test_an_outcomes_guard_is_planned_once_on_a_large_database(
    make_engine: MakeEngine, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's prepared statements")
    failed: list[BaseException] = []
    found_wrong = _progress.guard_failed

    def counting(exc: BaseException) -> bool:
        if found_wrong(exc):
            failed.append(exc)
            return True
        return False

    monkeypatch.setattr(_progress, "guard_failed", counting)
    wf = _fan()
    engine = await make_engine(wf)
    await engine.kernel.db.tx(_grow, 6000)
    async with engine.worker():
        for _ in range(12):
            run = await engine.start(wf, {})
            info = await engine.wait(run.id, timeout=60)
            assert info.status == "completed", info
    plans = await _loop_plans(engine)
    guards = [p for p in plans if _guard(p[0])]
    assert guards, f"no outcome guard was prepared on the connections the runs used: {plans}"
    for sql, generic, custom in plans:
        # PostgreSQL plans the first five executions of a statement for their values, then
        # keeps its generic plan unless the plans for the values look cheaper: no statement
        # of these runs (the guards among them) is planned at each execution
        assert custom <= 5, (generic, custom, sql)
    assert any(generic > 0 for _, generic, _ in guards), guards
    # (every prediction held: a guard that always failed would be redone by the slow path)
    assert failed == []
