"""Paging through the runs list from outside, as a dashboard does (``list_runs_page``): a walk
while runs are started and change status, bad cursors and limits, and what a deep page reads."""

from __future__ import annotations

import asyncio
import random

import pytest
import sqlalchemy as sa

from driver_native._runs import runs_query
from engine_port import RunInfo, RunStatus
from engine_port.errors import InvalidInputError

from . import workflows as w
from .conftest import MakeEngine


async def _start(engine: object, n: int, first: int = 0) -> list[RunInfo]:
    made: list[RunInfo] = []
    for c in range(first, first + n, 100):
        made += await asyncio.gather(
            *[
                engine.start(w.linear, {"n": i}, idempotency_key=f"k{i}")  # type: ignore[attr-defined]
                for i in range(c, min(first + n, c + 100))
            ]
        )
    return made


async def test_a_walk_lists_each_run_once_while_runs_start_and_change(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(w.linear)
    engine.cancel_wait = 0  # (no worker: a cancelled pending run stays compensating)
    made = await _start(engine, 1050)
    changed: set[str] = set()
    seen: list[RunInfo] = []
    pending: list[RunInfo] = []
    cursor = pcursor = None
    more = 1050
    while True:
        page, cursor = await engine.list_runs_page(limit=50, after=cursor, outputs=False)
        seen += page
        if pcursor is not None or len(seen) == len(page):
            got, pcursor = await engine.list_runs_page(
                limit=50, after=pcursor, status=RunStatus.PENDING, outputs=False
            )
            pending += got
        await _start(engine, 5, more)
        more += 5
        for run in random.sample(made, 10):
            if run.id not in changed:
                changed.add(run.id)
                await engine.cancel(run.id)  # (pending -> compensating, no worker)
        if cursor is None:
            break
    while pcursor is not None:
        got, pcursor = await engine.list_runs_page(
            limit=50, after=pcursor, status=RunStatus.PENDING, outputs=False
        )
        pending += got
    ids = [r.id for r in seen]
    assert len(ids) == len(set(ids)) == len(made)
    assert set(ids) == {r.id for r in made}
    keys = [(r.created_at, r.id) for r in seen]
    assert keys == sorted(keys, reverse=True)
    listed = [r.id for r in pending]
    assert len(listed) == len(set(listed))
    assert {r.id for r in made} - changed <= set(listed)
    assert all(r.status == "pending" for r in pending)


async def test_limit_zero_gives_no_next_cursor(make_engine: MakeEngine) -> None:
    """limit=0 read one run and gave it as the next page's cursor (Temporal gives None): a
    dashboard's page loop with limit 0 walked the whole table, one run per call."""
    engine = await make_engine(w.linear)
    await _start(engine, 3)
    assert await engine.list_runs_page(limit=0) == ([], None)


@pytest.mark.parametrize("limit", [2**63, 10**30])
async def test_a_huge_limit_lists_every_run(make_engine: MakeEngine, limit: int) -> None:
    """A raw OverflowError on SQLite, DataError "bigint out of range" on PostgreSQL."""
    engine = await make_engine(w.linear)
    await _start(engine, 3)
    page, cursor = await engine.list_runs_page(limit=limit, outputs=False)
    assert len(page) == 3 and cursor is None
    assert len(await engine.list_runs(limit=limit, outputs=False)) == 3


@pytest.mark.parametrize(
    "cursor", ["1.5~x\x00y", "1.5~\ud800", " 1.5 ~a", "1_000.5~a", "\uff11~a", "1~"]
)
async def test_a_forged_cursor_is_refused(make_engine: MakeEngine, cursor: str) -> None:
    """A NUL in the cursor's run id raised psycopg's DataError on PostgreSQL; numbers that
    float() reads but no cursor holds were taken as a position."""
    engine = await make_engine(w.linear)
    with pytest.raises(InvalidInputError, match="not a page cursor"):
        await engine.list_runs_page(after=cursor)


async def test_an_id_prefix_with_nul_is_refused(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear)
    with pytest.raises(InvalidInputError, match="NUL"):
        await engine.list_runs_page(id_prefix="ab\x00")
    with pytest.raises(InvalidInputError, match="NUL"):
        await engine.list_runs(id_prefix="ab\x00")


async def test_a_cursor_whose_run_was_purged_still_pages(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear)
    await _start(engine, 5)
    # (the engine's own order: runs started within a microsecond tie in RunInfo.created_at,
    # not in the stored time, and a sort of the RunInfos put two of them the other way round:
    # a clean clone, 2026-12-07)
    everything, _ = await engine.list_runs_page(limit=10)
    page, cursor = await engine.list_runs_page(limit=2)
    assert [r.id for r in page] == [r.id for r in everything[:2]]
    assert cursor is not None and cursor.endswith(page[-1].id)

    def delete(conn: sa.Connection) -> None:
        conn.execute(sa.text("DELETE FROM wfe_stages WHERE run_id = :r"), {"r": page[-1].id})
        conn.execute(sa.text("DELETE FROM wfe_jobs WHERE run_id = :r"), {"r": page[-1].id})
        conn.execute(sa.text("DELETE FROM wfe_runs WHERE id = :r"), {"r": page[-1].id})

    await engine.kernel.db.tx(delete)
    rest, last = await engine.list_runs_page(limit=10, after=cursor)
    assert [r.id for r in rest] == [r.id for r in everything[2:]]
    assert len(everything) == 5 and last is None


@pytest.mark.postgres
async def test_a_deep_page_reads_the_index_from_its_cursor(
    make_engine: MakeEngine, database_url: str
) -> None:
    """The keyset condition was ``created_at < x OR (created_at = x AND id < y)``, which
    PostgreSQL applied as a filter on a backward index scan from the newest run: a page in
    the middle of 10,000 runs read the 5,000 newer ones. A row comparison is an index
    condition: the scan starts at the cursor."""
    if not database_url.startswith("postgres"):
        pytest.skip("PostgreSQL's plan")
    engine = await make_engine(w.linear)
    await _start(engine, 2000)
    cursor = None
    for _ in range(20):
        _, cursor = await engine.list_runs_page(limit=50, after=cursor, outputs=False)
    assert cursor is not None
    at, _, run_id = cursor.partition("~")

    def explain(conn: sa.Connection) -> str:
        conn.execute(sa.text("ANALYZE wfe_runs"))
        q = runs_query(None, None, 51, (float(at), run_id))
        sql = q.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        rows = conn.execute(sa.text(f"EXPLAIN (ANALYZE) {sql}")).all()
        return "\n".join(r[0] for r in rows)

    plan = await engine.kernel.db.tx(explain)
    assert "Rows Removed by Filter" not in plan, plan
    assert "ix_wfe_runs_created" in plan, plan
