"""``list_runs_page`` of the routing engine: the drivers' pages one driver after the other
(the default driver first), behind one cursor that names the driver and carries its own
cursor, checked against the listing's filters. Two native drivers (two SQLite files)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    RunInfo,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
)
from engine_port._routing import RoutingEngine, _cursor
from engine_port.errors import InvalidInputError, PagingUnsupportedError, UnsupportedFeatureError
from wfe_ui._context import takes_filters


class In(BaseModel):
    n: int = 0


def _waiting(prefix: str) -> Workflow[In]:
    wf = Workflow(f"{prefix}-{uuid.uuid4().hex[:6]}", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


ON_OLD = _waiting("on-old")
ON_NEW = _waiting("on-new")
REGISTRY = Registry([ON_OLD, ON_NEW])


def _native(path: Path) -> WorkflowEngine:
    settings = EngineSettings(
        driver="native",
        database_url=f"sqlite:///{path / 'wfe.db'}",
        blob_url=f"file://{path / 'blobs'}",
    )
    return create_engine(settings, REGISTRY, event_sink=MemorySink())


def _router(tmp_path: Path, names: tuple[str, ...] = ("old", "new")) -> RoutingEngine:
    engines = {name: _native(tmp_path / name) for name in names}
    return RoutingEngine(REGISTRY, engines, default="old", routes={ON_NEW.id: "new"})


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[RoutingEngine]:
    async with _router(tmp_path) as routing:
        yield routing


async def _all_pages(
    engine: RoutingEngine, limit: int, **filters: Any
) -> tuple[list[str], list[list[RunInfo]]]:
    pages: list[list[RunInfo]] = []
    after: str | None = None
    while True:
        page, after = await engine.list_runs_page(limit=limit, after=after, **filters)
        pages.append(page)
        assert len(pages) < 50, "the cursor never ended"
        if after is None:
            return [r.id for p in pages for r in p], pages


async def _mixed(engine: RoutingEngine) -> tuple[list[str], list[str]]:
    """Three runs on the default driver (``old``) and two on ``new``, started interleaved;
    their ids, each driver's newest first."""
    old: list[str] = []
    new: list[str] = []
    for n in range(5):
        wf, ids = (ON_NEW, new) if n % 2 else (ON_OLD, old)
        ids.insert(0, (await engine.start(wf.id, {"n": n})).id)
    return old, new


async def test_pages_go_through_each_driver_in_turn(engine: RoutingEngine) -> None:
    old, new = await _mixed(engine)
    for limit in (1, 2, 3, 4, 5, 100):
        ids, pages = await _all_pages(engine, limit)
        # the default driver's runs, newest first, then the other driver's: each run once
        assert ids == old + new, limit
        # every page but the last is full (a page goes on into the next driver)
        assert all(len(p) == limit for p in pages[:-1]), limit
        assert len(pages[-1]) <= limit
    # a full page that ends the last driver has no next page
    page, after = await engine.list_runs_page(limit=5)
    assert [r.id for r in page] == old + new and after is None
    # the filters are each driver's own
    ids, _ = await _all_pages(engine, 1, workflow_id=ON_NEW.id)
    assert ids == new
    ids, _ = await _all_pages(engine, 2, id_prefix=new[0][:12])
    assert ids == [new[0]]
    # created_after is not part of the cursor's listing (the web view takes it from the
    # clock on each page): the next page follows
    since = datetime.now(UTC) - timedelta(hours=1)
    first, after = await engine.list_runs_page(limit=2, created_after=since)
    assert after is not None
    rest, _ = await engine.list_runs_page(
        limit=10, after=after, created_after=since + timedelta(seconds=1)
    )
    assert [r.id for r in first + rest] == old + new


async def test_empty_listings(engine: RoutingEngine) -> None:
    assert await engine.list_runs_page() == ([], None)
    assert await engine.list_runs_page(limit=1) == ([], None)
    await _mixed(engine)
    assert await engine.list_runs_page(limit=0) == ([], None)
    assert await engine.list_runs_page(status=RunStatus.COMPLETED, limit=1) == ([], None)
    assert await engine.list_runs_page(idempotency_key="none-such") == ([], None)


async def test_cursor_of_another_listing_or_a_forged_one_is_refused(
    engine: RoutingEngine, tmp_path: Path
) -> None:
    await _mixed(engine)
    _, after = await engine.list_runs_page(limit=4, workflow_id=None)
    assert after is not None
    _, on_old = await engine.list_runs_page(limit=1, workflow_id=ON_OLD.id)
    assert on_old is not None
    encoded, _, digest = after.rpartition(".")
    name, inner = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    assert name == "new" and inner is not None  # (4 of 5 runs: the cursor is in ``new``)
    # the payload changed (another driver, no inner cursor), the digest kept
    moved = base64.urlsafe_b64encode(json.dumps(["old", None]).encode()).decode().rstrip("=")
    native_cursor = (await engine.engines["old"].list_runs_page(limit=1))[1]  # type: ignore[attr-defined]
    bad = [
        "nonsense",
        "",
        ".",
        after[:-1] + ("0" if after[-1] != "0" else "1"),  # a corrupted digest
        f"{moved}.{digest}",
        native_cursor,  # a driver's own cursor
        after + "x" * 9000,
        "é." + digest,
    ]
    # forged with the digest right (it is a check, not a secret) but a driver not configured
    listing = json.dumps([["old", "new"], None, [], None, None, None])
    assert _cursor(listing, "new", inner) == after  # (the listing digested, as forged here)
    bad.append(_cursor(listing, "elsewhere", inner))
    for cursor in bad:
        with pytest.raises(InvalidInputError, match="not a page cursor"):
            await engine.list_runs_page(limit=4, after=cursor)
    # a cursor of another listing: other filters
    others: list[dict[str, Any]] = [
        {"workflow_id": ON_NEW.id},
        {"status": RunStatus.PENDING},
        {"status": [RunStatus.PENDING, RunStatus.MIGRATED]},
        {"version": "v9"},
        {"id_prefix": "x"},
        {"idempotency_key": "k"},
    ]
    for filters in others:
        with pytest.raises(InvalidInputError, match="not a page cursor"):
            await engine.list_runs_page(limit=4, after=after, **filters)
    with pytest.raises(InvalidInputError, match="not a page cursor"):
        await engine.list_runs_page(limit=1, after=on_old)  # (its workflow_id left out)
    # the same statuses asked in another order (or repeated) are the same listing
    _, by_two = await engine.list_runs_page(limit=4, status=[RunStatus.PENDING, RunStatus.RUNNING])
    assert by_two is not None
    await engine.list_runs_page(
        limit=4, after=by_two, status=[RunStatus.RUNNING, RunStatus.PENDING, RunStatus.PENDING]
    )
    # a cursor of a routing engine with other drivers
    async with _router(tmp_path / "three", ("old", "new", "third")) as three:
        await _mixed(three)
        _, elsewhere = await three.list_runs_page(limit=4)
        assert elsewhere is not None
    with pytest.raises(InvalidInputError, match="not a page cursor"):
        await engine.list_runs_page(limit=4, after=elsewhere)
    # the arguments are checked as a driver checks them
    with pytest.raises(InvalidInputError, match="cursor string"):
        await engine.list_runs_page(after=12)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="negative"):
        await engine.list_runs_page(limit=-1)
    with pytest.raises(InvalidInputError, match="not a run status"):
        await engine.list_runs_page(status="pendng")  # type: ignore[arg-type]
    # and the cursor it gave still works
    rest, end = await engine.list_runs_page(limit=4, after=after)
    assert len(rest) == 1 and end is None


async def test_a_migrated_run_is_listed_once(engine: RoutingEngine) -> None:
    old, new = await _mixed(engine)
    moved = old[1]
    snapshot = await engine.export_run(moved)
    await engine.complete_export(moved, "new")
    await engine.engines["new"].import_run(snapshot)
    sources = await engine.engines["old"].list_runs(status=RunStatus.MIGRATED)
    assert [r.id for r in sources] == [moved]  # (the copy the migration left on ``old``)
    for limit in (1, 2, 5):
        ids, pages = await _all_pages(engine, limit)
        assert sorted(ids) == sorted(old + new) and len(ids) == len(set(ids)), limit
        assert [r.status for p in pages for r in p if r.id == moved] == [RunStatus.PENDING]
        # listed where it lives now (its creation time kept: among ``new``'s runs)
        assert ids.index(moved) >= len(old) - 1
    assert [r.id for r in await engine.list_runs()].count(moved) == 1
    ids, _ = await _all_pages(engine, 2, status=RunStatus.PENDING)
    assert ids.count(moved) == 1
    # the copies migrations left, when asked for
    page, after = await engine.list_runs_page(status=RunStatus.MIGRATED)
    assert [(r.id, r.status, r.migrated_to) for r in page] == [
        (moved, RunStatus.MIGRATED, "new")
    ] and after is None
    both, _ = await engine.list_runs_page(status=[RunStatus.MIGRATED, RunStatus.PENDING])
    assert sorted(r.status for r in both if r.id == moved) == ["migrated", "pending"]


class _NoPaging(WorkflowEngine):
    """A third-party driver: the port's calls only (no list_runs_page)."""

    driver_name = "third-party"

    def _never(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    start = get_run = list_runs = wait = signal = cancel = redrive = _never
    list_versions = export_run = import_run = worker = connect = close = _never


async def test_a_driver_without_paging_makes_the_router_unpaged(
    engine: RoutingEngine, tmp_path: Path
) -> None:
    # both shipped drivers page: the router does, with every filter (the web view asks)
    assert takes_filters(engine.list_runs_page)
    mixed = RoutingEngine(
        REGISTRY,
        {"native": _native(tmp_path / "n"), "legacy": _NoPaging(REGISTRY)},
        default="native",
    )
    # a probe falls back to list_runs, as for that driver alone
    assert getattr(mixed, "list_runs_page", None) is None
    assert not hasattr(mixed, "list_runs_page")
    # a call says why and what to do, as an engine error
    with pytest.raises(UnsupportedFeatureError, match=r"\['legacy'\].*list_runs\(\)"):
        await mixed.list_runs_page(limit=1)
    assert issubclass(PagingUnsupportedError, UnsupportedFeatureError)
