"""``engine.events(run_id, after_seq=, limit=)``: a run's events by pages, the same on native
SQLite, native PostgreSQL and Temporal. A run of 50,000 events cost ~110 MB in one call; a
caller (a UI, an exporter) reads it page by page, each page starting after the last ``seq``
of the previous one, as Temporal's history has ``next_page_token`` and DBOS a cursor.

``events(run_id)`` with no paging argument stays every event at once (the CLI's
``wfe show --events``, the web view)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from conformance import eventually
from engine_port import (
    EngineSettings,
    Event,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)
from engine_port.errors import EngineError, InvalidInputError, RunNotFoundError


class Empty(BaseModel):
    pass


BUSINESS = 12  # events stage "a" emits (with the lifecycle ones: some 20 events a run)

Factory = Callable[[list[Workflow[Any]]], AbstractAsyncContextManager[Any]]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("temporal", marks=pytest.mark.temporal),
    ]
)
def engine_of(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """``engine_of(workflows)``: a connected engine of the driver with a worker running."""
    base: dict[str, Any] = {"blob_url": f"file://{tmp_path / 'blobs'}"}
    if request.param == "sqlite":
        base["database_url"] = f"sqlite:///{tmp_path / 'wfe.db'}"
    elif request.param == "postgres":
        base["database_url"] = request.getfixturevalue("pg_session").new_schema()
    else:
        server = request.getfixturevalue("temporal_server")
        base["driver"] = "temporal"
        base["temporal_address"] = server.address
        base["task_queue"] = f"pages-{uuid.uuid4().hex[:10]}"

    @asynccontextmanager
    async def factory(workflows: list[Workflow[Any]]) -> AsyncIterator[Any]:
        engine = create_engine(EngineSettings(**base), Registry(workflows), event_sink=MemorySink())
        async with engine, engine.worker():
            yield engine

    return factory


def _chatty() -> Workflow[Any]:
    wf = Workflow(f"pages-{uuid.uuid4().hex[:8]}", input=Empty)

    @wf.stage
    async def a(ctx: StageContext[Empty]) -> int:
        for n in range(BUSINESS):
            ctx.emit("page.note", {"n": n})
        return BUSINESS

    @wf.stage(after=[a])
    async def b(ctx: StageContext[Empty]) -> str:
        return "done"

    return wf


def _waiting() -> Workflow[Any]:
    wf = Workflow(f"pages-wait-{uuid.uuid4().hex[:8]}", input=Empty)

    @wf.stage
    async def a(ctx: StageContext[Empty]) -> Any:
        got = await ctx.step.wait_for_signal("go")
        ctx.emit("page.after", {"got": got})
        return got

    return wf


async def _all_pages(engine: Any, run_id: str, limit: int) -> list[list[Event]]:
    """A page loop: each page after the last ``seq`` of the one before, until a short one."""
    pages: list[list[Event]] = []
    after: int | None = None
    while True:
        page: list[Event] = await engine.events(run_id, after_seq=after, limit=limit)
        pages.append(page)
        assert len(pages) < 1000, "the page loop never ended"
        if len(page) < limit:
            return pages
        after = page[-1].seq


def _ids(events: list[Event]) -> list[tuple[int, str, str]]:
    return [(e.seq, e.type, e.id) for e in events]


async def test_pages_concatenate_to_every_event_in_order(engine_of: Factory) -> None:
    wf = _chatty()
    async with engine_of([wf]) as engine:
        run = await engine.start(wf.id, {})
        assert (await engine.wait(run.id, timeout=60)).status == RunStatus.COMPLETED
        everything = await engine.events(run.id)
        n = len(everything)
        assert n > BUSINESS + 4, _ids(everything)
        seqs = [e.seq for e in everything]
        assert seqs == sorted(set(seqs)), seqs  # in sequence order, each once
        assert [e.type for e in everything].count("page.note") == BUSINESS

        for limit in (1, 2, 5, 7, n - 1, n, n + 3):
            pages = await _all_pages(engine, run.id, limit)
            assert all(len(p) == limit for p in pages[:-1]), (limit, [len(p) for p in pages])
            assert len(pages[-1]) < limit
            joined = [e for p in pages for e in p]
            assert _ids(joined) == _ids(everything), limit
            assert joined == everything, limit  # (data, times and stage too)

        # bounds: after_seq is exclusive, limit alone is the first page, past the end is empty
        third = everything[2].seq
        assert _ids(await engine.events(run.id, after_seq=third)) == _ids(everything[3:])
        assert _ids(await engine.events(run.id, after_seq=third, limit=4)) == _ids(everything[3:7])
        assert _ids(await engine.events(run.id, limit=3)) == _ids(everything[:3])
        assert _ids(await engine.events(run.id, after_seq=0)) == _ids(everything)
        assert await engine.events(run.id, after_seq=everything[-1].seq) == []
        assert await engine.events(run.id, after_seq=everything[-1].seq + 10**6, limit=5) == []
        # and the whole list is still the whole list after all that paging
        assert await engine.events(run.id) == everything


async def test_a_page_loop_sees_the_events_of_a_run_still_running(engine_of: Factory) -> None:
    """A loop that read to the end of a suspended run, then reads on after the run moved,
    gets the new events (on Temporal: not the events replayed for the earlier pages)."""
    wf = _waiting()
    async with engine_of([wf]) as engine:
        run = await engine.start(wf.id, {})

        async def suspended() -> list[Event]:
            found: list[Event] = await engine.events(run.id)
            return found if any(e.type == "stage.suspended" for e in found) else []

        before = await eventually(suspended, timeout=60, what="the run suspended")
        first = await engine.events(run.id, limit=2)
        assert _ids(first) == _ids(before[:2])
        rest = [e for p in await _all_pages(engine, run.id, 2) for e in p]
        assert _ids(rest) == _ids(await engine.events(run.id))
        last = rest[-1].seq
        assert "page.after" not in [e.type for e in rest]

        await engine.signal(run.id, "go", {"k": 1})
        assert (await engine.wait(run.id, timeout=60)).status == RunStatus.COMPLETED
        later = await engine.events(run.id, after_seq=last, limit=100)
        assert "page.after" in [e.type for e in later], _ids(later)
        assert _ids(rest + later) == _ids(await engine.events(run.id))


BAD: list[tuple[dict[str, Any], str]] = [
    ({"after_seq": -1}, "0 or more"),
    ({"after_seq": "3"}, "whole number"),
    ({"after_seq": 2.0}, "whole number"),
    ({"after_seq": True}, "whole number"),
    ({"limit": 0}, "1 or more"),
    ({"limit": -5}, "1 or more"),
    ({"limit": "10"}, "whole number"),
    ({"limit": 1.5}, "whole number"),
    ({"limit": False}, "whole number"),
    ({"after_seq": -1, "limit": 0}, "0 or more"),
]


async def test_bad_page_arguments_and_unknown_runs(engine_of: Factory) -> None:
    wf = _chatty()
    async with engine_of([wf]) as engine:
        run = await engine.start(wf.id, {})
        await engine.wait(run.id, timeout=60)
        for kwargs, says in BAD:
            with pytest.raises(InvalidInputError) as caught:
                await engine.events(run.id, **kwargs)
            assert isinstance(caught.value, EngineError)
            assert says in str(caught.value), (kwargs, str(caught.value))
            field = next(iter(kwargs))
            assert field in str(caught.value), (kwargs, str(caught.value))
        with pytest.raises(InvalidInputError):
            await engine.events(17, limit=5)
        missing = f"no-such-{uuid.uuid4().hex[:8]}"
        with pytest.raises(RunNotFoundError):
            await engine.events(missing)
        for kwargs in ({"limit": 5}, {"after_seq": 0}, {"after_seq": 3, "limit": 1}):
            with pytest.raises(RunNotFoundError):
                await engine.events(missing, **kwargs)
        # (an existing run's page past its end is empty, never "not found")
        assert await engine.events(run.id, after_seq=10**9, limit=1) == []
