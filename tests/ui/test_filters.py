"""The runs list's filters are applied by the driver's store, not by scanning the newest runs:
a run behind any number of newer ones is found by each of its filters (issue 18)."""

from __future__ import annotations

import asyncio
import functools
import html
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from starlette.testclient import TestClient

from driver_native._runs import runs_query
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from wfe_ui import _pages, create_app


class In(BaseModel):
    i: int


def flow(version: str, workflow_id: str = "flt") -> Workflow[In]:
    wf: Workflow[In] = Workflow(workflow_id, input=In, version=version)

    @wf.stage
    async def only(ctx: StageContext[In]) -> int:
        return ctx.input.i

    return wf


def registry() -> Registry:
    return Registry([flow("old"), flow("new"), flow("other-v", "other")])


def ids_of(html: str) -> list[str]:
    return re.findall(r'class="run-link">([^<]+)<', html)


@pytest.fixture
def settings(tmp_path: Path) -> EngineSettings:
    return EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )


def test_a_run_older_than_the_scanned_ones_is_found_by_each_filter(
    settings: EngineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the view used to filter version, age and search over the newest SCAN_LIMIT runs; with
    # a scan of 3 and 6 newer runs, the oldest run is out of reach of any such scan
    monkeypatch.setattr(_pages, "SCAN_LIMIT", 3)

    async def start() -> tuple[str, list[str]]:
        # (no worker: cancel() would wait its default 10 s for one to end the run)
        async with create_engine(settings, registry(), cancel_wait=0.2) as engine:
            old = await engine.start("other", {"i": 0}, idempotency_key="the-old-one")
            await engine.cancel(old.id)
            newer = [(await engine.start("flt", {"i": i}, version="new")).id for i in range(6)]
            return old.id, newer

    old, newer = asyncio.run(start())
    with TestClient(create_app(create_engine(settings, registry()))) as client:
        for params in (
            {"version": "other-v"},
            {"workflow": "other"},
            {"status": "compensating"},  # cancelled, no worker to compensate
            {"q": "the-old-one"},
            {"q": old[:10]},
            {"q": old},
            {"since": "1h", "version": "other-v"},
        ):
            page = client.get("/runs", params=params)
            assert page.status_code == 200, page.text
            assert ids_of(page.text) == [old], params
            assert "look at the newest" not in page.text
        assert ids_of(client.get("/runs", params={"version": "new", "limit": "20"}).text) == list(
            reversed(newer)
        )
        # pages of a filtered list follow the filter
        first = client.get("/runs", params={"version": "new", "limit": "20"}).text
        assert 'id="older"' not in first


def test_created_after_is_applied_by_the_store(settings: EngineSettings) -> None:
    async def check() -> None:
        async with create_engine(settings, registry()) as engine:
            run = await engine.start("flt", {"i": 1}, version="new")
            paged = engine.list_runs_page  # type: ignore[attr-defined]
            hour_ago = datetime.now(UTC) - timedelta(hours=1)
            soon = datetime.now(UTC) + timedelta(hours=1)
            found, _ = await paged(created_after=hour_ago, outputs=False)
            assert [r.id for r in found] == [run.id] and found[0].input is None
            assert (await paged(created_after=soon))[0] == []
            assert (await paged(version="old"))[0] == []
            assert [r.id for r in (await paged(id_prefix=run.id[:5]))[0]] == [run.id]
            assert (await paged(idempotency_key="nope"))[0] == []

    asyncio.run(check())


@pytest.mark.postgres
def test_run_id_prefix_search_reads_an_index_on_postgres(pg_session: Any) -> None:
    # schema v10: without the pattern index the prefix search read every run (a sequential
    # scan of 22 ms at 100,000 runs in bench/tools/ui_pages.py); the plan, not a time, says it
    url = pg_session.new_schema()

    async def start() -> str:
        async with create_engine(EngineSettings(database_url=url), registry()) as engine:
            return (await engine.start("flt", {"i": 1}, version="new")).id

    run_id = asyncio.run(start())
    db = sa.create_engine(url)
    try:
        with db.connect() as conn:
            conn.execute(sa.text("SET enable_seqscan = off"))
            q = runs_query(None, None, 51, id_prefix=run_id[:6])
            sql = q.compile(dialect=db.dialect, compile_kwargs={"literal_binds": True})
            plan = "\n".join(conn.execute(sa.text(f"EXPLAIN {sql}")).scalars())
    finally:
        db.dispose()
    assert "ix_wfe_runs_id_prefix" in plan, plan


def test_older_pages_of_an_age_filter_keep_its_cutoff(
    settings: EngineSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "Older runs" link of a list filtered by age asks the driver for the same cutoff as
    the first page: a driver's cursor is good only for the listing that gave it, and the
    Temporal driver refused page 2 with InvalidInputError when the view took the cutoff
    from the clock again."""
    from driver_native import _engine as native

    asked: list[datetime | None] = []
    listing = native.NativeEngine.list_runs_page

    @functools.wraps(listing)
    async def recording(self: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("created_after"))
        return await listing(self, **kwargs)

    monkeypatch.setattr(native.NativeEngine, "list_runs_page", recording)

    async def start() -> list[str]:
        async with create_engine(settings, registry()) as engine:
            return [(await engine.start("flt", {"i": i}, version="new")).id for i in range(25)]

    started = asyncio.run(start())
    with TestClient(create_app(create_engine(settings, registry()))) as client:
        first = client.get("/runs", params={"since": "1h", "limit": "20"}).text
        older = re.search(r'href="(/runs\?[^"]+)" id="older"', first)
        assert older, first
        second = client.get(html.unescape(older.group(1)))
        assert second.status_code == 200, second.text
        assert ids_of(first) + ids_of(second.text) == list(reversed(started))
        back = re.search(r'href="(/runs\?[^"]*)" id="newest"', second.text)
        assert back and "cutoff" not in back.group(1)
    assert len(asked) == 2 and asked[0] is not None and asked[0] == asked[1]
    with TestClient(create_app(create_engine(settings, registry()))) as client:
        bad = client.get("/runs", params={"since": "1h", "after": "x", "cutoff": "yesterday"})
        assert bad.status_code == 400 and "cutoff" in bad.text
