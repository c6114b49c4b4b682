"""The routing engine (one engine over several drivers): every call finds the run wherever it
lives, and what it merges from several drivers keeps each driver's own contract (list_runs
newest first, dead letters oldest first).

Most tests route between the native driver (an SQLite file) and the memory driver (another
native store), so they need no server; the ``temporal`` one routes between the native driver
and a Temporal dev server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from conformance import eventually, wait_for_events
from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
)
from engine_port._routing import RoutingEngine
from engine_port.errors import (
    DriverUnavailableError,
    IdempotencyConflictError,
    InvalidInputError,
)


class In(BaseModel):
    n: int = 0


def _waiting(prefix: str) -> Workflow[In]:
    wf = Workflow(f"{prefix}-{uuid.uuid4().hex[:6]}", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


@pytest.fixture
def wfs() -> tuple[Workflow[In], Workflow[In]]:
    """``on_native`` starts its runs on the native driver, ``on_other`` on the other one."""
    return _waiting("on-native"), _waiting("on-other")


def _native(tmp_path: Path, registry: Registry, sink: MemorySink, **extra: Any) -> WorkflowEngine:
    settings = EngineSettings(
        driver="native",
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
        blob_url=f"file://{tmp_path / 'blobs'}",
        **extra,
    )
    return create_engine(settings, registry, event_sink=sink)


@pytest.fixture
async def routing(
    tmp_path: Path, wfs: tuple[Workflow[In], Workflow[In]]
) -> AsyncIterator[tuple[RoutingEngine, MemorySink]]:
    on_native, on_other = wfs
    registry = Registry([on_native, on_other])
    sink = MemorySink()
    engines = {
        "native": _native(tmp_path, registry, sink),
        "memory": create_engine(EngineSettings(driver="memory"), registry, event_sink=sink),
    }
    engine = RoutingEngine(registry, engines, default="native", routes={on_other.id: "memory"})
    async with engine:
        yield engine, sink


async def test_list_runs_is_newest_first_across_drivers(
    routing: tuple[RoutingEngine, MemorySink], wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    engine, _ = routing
    on_native, on_other = wfs
    first = await engine.start(on_native.id, {"n": 1})  # native
    second = await engine.start(on_other.id, {"n": 2})  # memory
    third = await engine.start(on_native.id, {"n": 3})  # native
    # WorkflowEngine.list_runs: "Runs, newest first", whichever driver holds them
    assert [r.id for r in await engine.list_runs()] == [third.id, second.id, first.id]
    # a limit keeps the newest runs, not the first driver's
    assert [r.id for r in await engine.list_runs(limit=2)] == [third.id, second.id]


async def test_abort_and_complete_export_find_the_run(
    routing: tuple[RoutingEngine, MemorySink], wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    engine, _ = routing
    on_native, on_other = wfs
    kept = await engine.start(on_other.id, {"n": 1})  # lives on the memory driver
    moved = await engine.start(on_native.id, {"n": 2})  # lives on the native driver
    await engine.export_run(kept.id)
    await engine.abort_export(kept.id)  # was: UnsupportedFeatureError on a routing engine
    snapshot = await engine.export_run(moved.id)
    done = await engine.complete_export(moved.id, "memory")
    assert done.status == RunStatus.MIGRATED and done.migrated_to == "memory"
    await engine.engines["memory"].import_run(snapshot)
    async with engine.worker():
        for run in (kept, moved):
            # the aborted export runs on where it is; the moved run is found on its target
            await engine.get_run(run.id)
            await engine.signal(run.id, "go", {"for": run.id})
            info = await engine.wait(run.id, timeout=30)
            assert info.status == RunStatus.COMPLETED and info.output == {"for": run.id}


async def test_drain_sends_new_runs_to_the_target_and_lifts(
    routing: tuple[RoutingEngine, MemorySink], wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    engine, _ = routing
    on_native, _ = wfs
    await engine.drain([on_native.id], "memory")  # was: UnsupportedFeatureError
    drained = await engine.start(on_native.id, {"n": 1})
    assert [r.id for r in await engine.engines["memory"].list_runs()] == [drained.id]
    await engine.drain([on_native.id], None)
    lifted = await engine.start(on_native.id, {"n": 2})
    assert [r.id for r in await engine.engines["native"].list_runs()] == [lifted.id]


async def test_dead_letters_are_oldest_first_across_drivers(
    tmp_path: Path, wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    on_native, on_other = wfs
    registry = Registry([on_native, on_other])
    sink = MemorySink()
    sink.failing = True
    fast_dlq: dict[str, Any] = {"dead_letter_after": 1, "outbox_dead_letter_min_seconds": 0.0}
    engines = {
        "native": _native(tmp_path, registry, sink, **fast_dlq),
        "memory": create_engine(
            EngineSettings(driver="memory", **fast_dlq), registry, event_sink=sink
        ),
    }
    engine = RoutingEngine(registry, engines, default="native", routes={on_other.id: "memory"})
    async with engine:
        first = await engine.start(on_native.id, {})
        second = await engine.start(on_other.id, {})
        third = await engine.start(on_native.id, {})

        async def all_dead() -> list[Any]:
            await engine.flush_events()
            dead = await engine.dead_letters()
            return dead if {e.run_id for e in dead} == {first.id, second.id, third.id} else []

        dead = await eventually(all_dead, what="run.created of the three runs dead-lettered")
    # WorkflowEngine.dead_letters: "oldest first", whichever driver holds them
    assert [e.run_id for e in dead] == [first.id, second.id, third.id]
    assert [e.at for e in dead] == sorted(e.at for e in dead)


class _Broken(WorkflowEngine):
    """A driver whose connection fails (or whose close fails); the tests only connect and
    close it."""

    driver_name = "broken"

    def __init__(self, registry: Registry, *, on: str) -> None:
        super().__init__(registry)
        self.on = on

    async def connect(self) -> None:
        if self.on == "connect":
            raise DriverUnavailableError("cannot reach the broken driver")

    async def close(self) -> None:
        if self.on == "close":
            raise DriverUnavailableError("the broken driver failed to close")

    def _never(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    start = get_run = list_runs = wait = signal = cancel = redrive = _never
    list_versions = export_run = import_run = worker = _never


# -- an idempotency key across drivers --------------------------------------------------------


def _two_natives(
    tmp_path: Path, registry: Registry, routes: dict[str, str] | None = None
) -> RoutingEngine:
    """A routing engine over two native drivers (two SQLite files), ``old`` the default; new
    engine objects on each call, over the same files (a process started with other routes)."""
    engines = {name: _native(tmp_path / name, registry, MemorySink()) for name in ("old", "new")}
    return RoutingEngine(registry, engines, default="old", routes=routes)


async def test_a_repeated_key_after_the_routes_changed_returns_the_first_run(
    tmp_path: Path, wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    """start(..., idempotency_key=k) twice returns the same run (§5), also when the workflow
    was routed to another driver between the two starts: the second start started a second
    run there."""
    wf, _ = wfs
    registry = Registry([wf])
    async with _two_natives(tmp_path, registry) as before:
        first = await before.start(wf.id, {"n": 1}, idempotency_key="order-1")
    async with _two_natives(tmp_path, registry, routes={wf.id: "new"}) as after:
        again = await after.start(wf.id, {"n": 1}, idempotency_key="order-1")
        assert again.id == first.id and again.status == RunStatus.PENDING
        assert await after.engines["new"].list_runs() == []
        # a different input under the key is a conflict, as on one driver
        with pytest.raises(IdempotencyConflictError) as conflict:
            await after.start(wf.id, {"n": 2}, idempotency_key="order-1")
        assert conflict.value.run_id == first.id
        with pytest.raises(InvalidInputError):  # (the input is checked first, as a driver does)
            await after.start(wf.id, {"n": "two"}, idempotency_key="order-1")
        # a new key, and no key, start on the new route
        other = await after.start(wf.id, {"n": 1}, idempotency_key="order-2")
        bare = await after.start(wf.id, {"n": 1})
        assert {r.id for r in await after.engines["new"].list_runs()} == {other.id, bare.id}
        assert [r.id for r in await after.engines["old"].list_runs()] == [first.id]


async def test_a_repeated_key_of_a_drained_workflow_returns_the_first_run(
    tmp_path: Path, wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    """A drain sends new runs to its target; a repeat of a key whose run started before the
    drain is not a new run."""
    wf, _ = wfs
    async with _two_natives(tmp_path, Registry([wf])) as engine:
        first = await engine.start(wf.id, {"n": 1}, idempotency_key="order-1")
        await engine.drain([wf.id], "new")
        again = await engine.start(wf.id, {"n": 1}, idempotency_key="order-1")
        assert again.id == first.id
        assert await engine.engines["new"].list_runs() == []
        drained = await engine.start(wf.id, {"n": 1}, idempotency_key="order-2")
        assert [r.id for r in await engine.engines["new"].list_runs()] == [drained.id]


async def test_a_repeated_key_of_a_migrated_run_returns_its_live_copy(
    routing: tuple[RoutingEngine, MemorySink], wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    """The source driver's start returns the copy a migration left behind (``migrated``);
    the routing engine returns the run where it lives now."""
    engine, _ = routing
    on_native, _ = wfs
    first = await engine.start(on_native.id, {"n": 1}, idempotency_key="order-1")
    snapshot = await engine.export_run(first.id)
    await engine.complete_export(first.id, "memory")
    await engine.engines["memory"].import_run(snapshot)
    again = await engine.start(on_native.id, {"n": 1}, idempotency_key="order-1")
    assert again.id == first.id and again.status == RunStatus.PENDING


@pytest.fixture
def native_alone(tmp_path: Path) -> Iterator[WorkflowEngine]:
    yield _native(tmp_path, Registry(), MemorySink())


@pytest.mark.parametrize("on", ["connect", "close"])
async def test_every_driver_is_closed_when_another_fails(
    native_alone: WorkflowEngine, on: str
) -> None:
    broken = _Broken(Registry(), on=on)
    # connect: the native engine connects before the broken one fails; close: the broken
    # one fails to close before the native one is closed
    pair: list[tuple[str, WorkflowEngine]] = [("native", native_alone), ("broken", broken)]
    engines = dict(pair if on == "connect" else pair[::-1])
    engine = RoutingEngine(Registry(), engines, default="native")
    with pytest.raises(DriverUnavailableError, match="broken driver"):
        async with engine:
            pass
    # the native engine must not stay connected behind the error
    with pytest.raises(DriverUnavailableError, match="not connected"):
        await native_alone.list_runs()


@pytest.mark.temporal
async def test_list_runs_newest_first_native_and_temporal(
    temporal_server: Any, tmp_path: Path, wfs: tuple[Workflow[In], Workflow[In]]
) -> None:
    on_native, on_other = wfs
    settings = EngineSettings(
        driver="native",
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
        blob_url=f"file://{tmp_path / 'blobs'}",
        temporal_address=temporal_server.address,
        task_queue=f"route-{uuid.uuid4().hex[:8]}",
        routes={on_other.id: "temporal"},
    )
    sink = MemorySink()
    engine = create_engine(settings, Registry([on_native, on_other]), event_sink=sink)
    assert isinstance(engine, RoutingEngine)
    async with engine, engine.worker():
        first = await engine.start(on_native.id, {"n": 1})
        second = await engine.start(on_other.id, {"n": 2})
        third = await engine.start(on_native.id, {"n": 3})

        async def newest_two() -> bool:
            # (Temporal lists a run once its visibility record is written: a moment after
            # the start on a loaded host, when the older native run came second)
            return [r.id for r in await engine.list_runs(limit=2)] == [third.id, second.id]

        await eventually(newest_two, what="the newest two runs, across both drivers")
        # and every call finds each run on its driver
        for run in (first, second):
            await wait_for_events(sink, run.id, "stage.suspended")
            assert (await engine.signal(run.id, "go", {"n": run.id})).delivered
            assert (await engine.wait(run.id, timeout=30)).output == {"n": run.id}
        assert (await engine.cancel(third.id)).status in ("cancelled", "compensating")
        assert (await engine.wait(third.id, timeout=30)).status == RunStatus.CANCELLED
