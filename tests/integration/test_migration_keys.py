"""After a move: a keyed start on the source (directly, or through a routing engine), and what
``migrate_runs`` reports for the run ids it was given."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    Registry,
    RoutingEngine,
    RunMove,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
    migrate_run,
    migrate_runs,
)
from engine_port.errors import IdempotencyConflictError, RunNotActiveError, RunNotFoundError
from tests.support.databases import PostgresSession

KEY = "order-42"


class Order(BaseModel):
    n: int


def _waiter() -> Workflow[Order]:
    wf = Workflow(f"mig-key-{uuid.uuid4().hex[:8]}", input=Order, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Order]) -> Any:
        return {"got": await ctx.step.wait_for_signal("go"), "n": ctx.input.n}

    return wf


async def _until(engine: WorkflowEngine, run_id: str, status: RunStatus) -> None:
    deadline = time.monotonic() + 30
    while (await engine.get_run(run_id)).status != status:
        assert time.monotonic() < deadline, f"run {run_id} never became {status}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _moved(
    src_url: str, dst_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Workflow[Order], WorkflowEngine, WorkflowEngine, str]]:
    """A run started with idempotency key ``KEY`` on the first database, parked in its signal
    wait, and moved to the second."""
    wf = _waiter()
    registry = Registry([wf])
    blobs = f"file://{tmp_path / 'blobs'}"
    async with (
        create_engine(EngineSettings(database_url=src_url, blob_url=blobs), registry) as src,
        create_engine(EngineSettings(database_url=dst_url, blob_url=blobs), registry) as dst,
    ):
        run = await src.start(wf.id, {"n": 1}, idempotency_key=KEY)
        async with src.worker():
            await _until(src, run.id, RunStatus.SUSPENDED)
        assert (await migrate_run(src, dst, run.id)).outcome == "moved"
        yield wf, src, dst, run.id


async def _ids(engine: WorkflowEngine) -> list[str]:
    return [r.id for r in await engine.list_runs(outputs=False)]


@pytest.fixture
def pg_url(pg_session: PostgresSession) -> str:
    return pg_session.new_schema()


# -- 1. a keyed start after the move -------------------------------------------------------------


@pytest.mark.postgres
async def test_a_keyed_start_on_the_source_after_a_move_says_where_the_run_went(
    tmp_path: Path, pg_url: str
) -> None:
    """The source answered with the run's ``migrated`` record, a run the caller could neither
    wait on nor signal there. It now raises RunNotActiveError naming the run and where it
    went (as a signal or cancel of the moved run there does); no second run is started."""
    async with _moved(f"sqlite:///{tmp_path / 'a.db'}", pg_url, tmp_path) as (wf, src, dst, rid):
        with pytest.raises(RunNotActiveError, match="moved to native") as caught:
            await src.start(wf.id, {"n": 1}, idempotency_key=KEY)
        assert caught.value.run_id == rid
        assert caught.value.status == RunStatus.MIGRATED
        assert caught.value.migrated_to == "native"
        # a different input under the key is still the caller's mistake, told as such
        with pytest.raises(IdempotencyConflictError):
            await src.start(wf.id, {"n": 2}, idempotency_key=KEY)
        assert await _ids(src) == [rid] and await _ids(dst) == [rid]
        # the target answers the keyed start with the live run
        again = await dst.start(wf.id, {"n": 1}, idempotency_key=KEY)
        assert (again.id, again.status) == (rid, RunStatus.SUSPENDED)


@pytest.mark.postgres
@pytest.mark.parametrize("route", ["source", "target"])
async def test_through_a_router_a_keyed_start_after_a_move_answers_with_the_run_on_the_target(
    tmp_path: Path, pg_url: str, route: str
) -> None:
    """Whichever driver the workflow is routed to, the router answers a keyed start after
    the move with the live copy of the run (same id), and no second run exists."""
    async with _moved(f"sqlite:///{tmp_path / 'a.db'}", pg_url, tmp_path) as (wf, src, dst, rid):
        router = RoutingEngine(
            Registry([wf]),
            {"sqlite": src, "postgres": dst},
            default="sqlite",
            routes={wf.id: "sqlite" if route == "source" else "postgres"},
        )
        info = await router.start(wf.id, {"n": 1}, idempotency_key=KEY)
        assert (info.id, info.status) == (rid, RunStatus.SUSPENDED)
        assert await _ids(src) == [rid] and await _ids(dst) == [rid]


@pytest.mark.postgres
async def test_a_router_follows_a_run_that_moved_while_it_looked_for_the_key(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router's key lookup on the other drivers missed the run (it moved between that
    lookup and the start on the routed driver): the routed driver's RunNotActiveError is
    followed to the run's live copy instead of reaching the caller."""
    async with _moved(f"sqlite:///{tmp_path / 'a.db'}", pg_url, tmp_path) as (wf, src, dst, rid):

        async def nothing(**_: Any) -> tuple[list[Any], None]:
            return [], None

        monkeypatch.setattr(dst, "list_runs_page", nothing)
        router = RoutingEngine(Registry([wf]), {"sqlite": src, "postgres": dst}, default="sqlite")
        info = await router.start(wf.id, {"n": 1}, idempotency_key=KEY)
        assert (info.id, info.status) == (rid, RunStatus.SUSPENDED)
        assert await _ids(src) == [rid] and await _ids(dst) == [rid]
        # a router that does not know where the run went passes the error on, whether the
        # key's run is on the driver the workflow is routed to or on another one
        alone = RoutingEngine(Registry([wf]), {"sqlite": src}, default="sqlite")
        with pytest.raises(RunNotActiveError, match="moved to native"):
            await alone.start(wf.id, {"n": 1}, idempotency_key=KEY)
        other_url = f"sqlite:///{tmp_path / 'other.db'}"
        async with create_engine(EngineSettings(database_url=other_url), Registry([wf])) as other:
            elsewhere = RoutingEngine(
                Registry([wf]), {"sqlite": src, "other": other}, default="other"
            )
            with pytest.raises(RunNotActiveError, match="moved to native"):
                await elsewhere.start(wf.id, {"n": 1}, idempotency_key=KEY)
            assert await _ids(other) == []


# -- 2. what migrate_runs reports for the run ids it was given ---------------------------------


def _sqlite_pair(tmp_path: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"


@contextlib.asynccontextmanager
async def _two_sqlite(
    tmp_path: Path,
) -> AsyncIterator[tuple[Workflow[Order], WorkflowEngine, WorkflowEngine]]:
    """The waiting workflow, and a source and a target engine on two SQLite files."""
    wf = _waiter()
    registry = Registry([wf])
    src_url, dst_url = _sqlite_pair(tmp_path)
    async with (
        create_engine(EngineSettings(database_url=src_url), registry) as src,
        create_engine(EngineSettings(database_url=dst_url), registry) as dst,
    ):
        yield wf, src, dst


@pytest.mark.parametrize("dry_run", [False, True])
async def test_a_named_run_already_moved_is_reported_skipped(tmp_path: Path, dry_run: bool) -> None:
    """``migrate_runs(run_ids=[moved])`` returned an empty report (only the CLI said why)."""
    async with _moved(*_sqlite_pair(tmp_path), tmp_path) as (wf, src, dst, rid):
        seen: list[RunMove] = []
        report = await migrate_runs(src, dst, run_ids=[rid], dry_run=dry_run, progress=seen.append)
        expected = [
            RunMove(
                run_id=rid, workflow_id=wf.id, outcome="skipped", reason="already moved to native"
            )
        ]
        assert report.moves == expected and seen == expected
        assert report.count("skipped") == 1


async def test_a_named_ended_run_is_reported_skipped_after_the_moves(tmp_path: Path) -> None:
    async with _two_sqlite(tmp_path) as (wf, src, dst):
        ended = await src.start(wf.id, {"n": 1})
        async with src.worker():
            await src.signal(ended.id, "go", True)
            assert (await src.wait(ended.id, timeout=30)).status == RunStatus.COMPLETED
        live = await src.start(wf.id, {"n": 2})
        report = await migrate_runs(src, dst, run_ids=[ended.id, live.id])
        assert [(m.run_id, m.outcome, m.reason) for m in report.moves] == [
            (live.id, "moved", None),
            (ended.id, "skipped", "completed runs stay where they are"),
        ]


async def test_a_run_id_named_twice_is_moved_and_reported_once(tmp_path: Path) -> None:
    """The same id twice in ``run_ids`` was moved, then reported a second time as skipped
    ("already moved") by the same call."""
    async with _two_sqlite(tmp_path) as (wf, src, dst):
        run = await src.start(wf.id, {"n": 1})
        report = await migrate_runs(src, dst, run_ids=[run.id, run.id])
        assert [(m.run_id, m.outcome) for m in report.moves] == [(run.id, "moved")]


async def test_an_empty_list_of_run_ids_moves_nothing(tmp_path: Path) -> None:
    """``run_ids=[]`` (a caller's selection that came out empty) selected every active run
    of the source and moved them all."""
    async with _two_sqlite(tmp_path) as (wf, src, dst):
        run = await src.start(wf.id, {"n": 1})
        report = await migrate_runs(src, dst, run_ids=[])
        assert report.moves == []
        assert (await src.get_run(run.id)).status == RunStatus.PENDING
        assert await _ids(dst) == []


async def test_a_run_id_not_on_the_source_raises_before_anything_moves(tmp_path: Path) -> None:
    """Decision: an id the source does not hold raises RunNotFoundError naming it (a typo
    must not read as "nothing to move"); the other named runs are left untouched."""
    async with _two_sqlite(tmp_path) as (wf, src, dst):
        run = await src.start(wf.id, {"n": 1})
        with pytest.raises(RunNotFoundError, match="nope"):
            await migrate_runs(src, dst, run_ids=[run.id, "nope"])
        assert (await src.get_run(run.id)).status == RunStatus.PENDING
        assert await _ids(dst) == []


# -- the same on Temporal as the source -------------------------------------------------------


def _temporal(temporal_server: Any, tmp_path: Path, registry: Registry) -> WorkflowEngine:
    return create_engine(
        EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"mk-{uuid.uuid4().hex[:10]}",
            blob_url=f"file://{tmp_path / 'blobs'}",
        ),
        registry,
    )


@pytest.mark.temporal
async def test_a_keyed_start_on_temporal_after_a_move_says_where_the_run_went(
    temporal_server: Any, tmp_path: Path
) -> None:
    """Temporal answered the key with the ``migrated`` record too (it started the run, under
    the key's own run id)."""
    wf = _waiter()
    registry = Registry([wf])
    key = f"order-{uuid.uuid4().hex}"  # (one Temporal namespace for the whole session)
    native_url = f"sqlite:///{tmp_path / 'n.db'}"
    blobs = f"file://{tmp_path / 'blobs'}"
    async with (
        _temporal(temporal_server, tmp_path, registry) as src,
        create_engine(EngineSettings(database_url=native_url, blob_url=blobs), registry) as dst,
    ):
        run = await src.start(wf.id, {"n": 1}, idempotency_key=key)
        async with src.worker():
            await _until(src, run.id, RunStatus.SUSPENDED)
        assert (await migrate_run(src, dst, run.id)).outcome == "moved"
        with pytest.raises(RunNotActiveError, match="moved to native") as caught:
            await src.start(wf.id, {"n": 1}, idempotency_key=key)
        assert (caught.value.run_id, caught.value.migrated_to) == (run.id, "native")
        with pytest.raises(IdempotencyConflictError):
            await src.start(wf.id, {"n": 2}, idempotency_key=key)


@pytest.mark.temporal
async def test_a_key_whose_run_passed_through_temporal_never_starts_a_second_run_there(
    temporal_server: Any, tmp_path: Path
) -> None:
    """A keyed native run moved to Temporal and on to another database: Temporal took the
    key's record of a run that moved away for "no run of this key" and started a second run
    of the key (under the key's own run id)."""
    wf = _waiter()
    registry = Registry([wf])
    key = f"order-{uuid.uuid4().hex}"  # (one Temporal namespace for the whole session)
    blobs = f"file://{tmp_path / 'blobs'}"
    one, two = _sqlite_pair(tmp_path)
    async with (
        create_engine(EngineSettings(database_url=one, blob_url=blobs), registry) as first,
        _temporal(temporal_server, tmp_path, registry) as temporal,
        create_engine(EngineSettings(database_url=two, blob_url=blobs), registry) as last,
    ):
        run = await first.start(wf.id, {"n": 1}, idempotency_key=key)
        async with first.worker():
            await _until(first, run.id, RunStatus.SUSPENDED)
        assert (await migrate_run(first, temporal, run.id)).outcome == "moved"
        assert (await migrate_run(temporal, last, run.id)).outcome == "moved"
        with pytest.raises(RunNotActiveError, match="moved to native") as caught:
            await temporal.start(wf.id, {"n": 1}, idempotency_key=key)
        assert caught.value.run_id == run.id
        assert await _ids(temporal) == [run.id]
        async with last.worker():
            await last.signal(run.id, "go", True)
            done = await last.wait(run.id, timeout=30)
        assert done.status == RunStatus.COMPLETED and done.output == {"got": True, "n": 1}
