"""Moving live runs between the native driver (SQLite) and Temporal, both ways, against the
newer rules: several waits for one signal name (``go``, ``go#2``, ...), a ``stage.suspended``
id made of the suspending step and its deadline, JSON key order kept by Temporal's data
converter, and an imported run that continues as new."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from conformance._trace import normalise
from driver_temporal import _moving
from engine_port import (
    EngineSettings,
    Event,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
    migrate_run,
)
from engine_port.errors import StepTimeoutError

pytestmark = pytest.mark.temporal

HITS: Counter[str] = Counter()


class Doc(BaseModel):
    doc: dict[str, Any] = {}


def _hit(key: str) -> str:
    HITS[key] += 1
    return key


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def _multi_wait() -> Workflow[Doc]:
    """a waits for go twice, then other, then go twice more; steps between the waits."""
    wf = Workflow(f"mig2-multi-{_tag()}", input=Doc, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Doc]) -> Any:
        g1 = await ctx.step.wait_for_signal("go")
        await ctx.step.run("after1", _hit, f"{ctx.run_id}:after1")
        g2 = await ctx.step.wait_for_signal("go")
        o = await ctx.step.wait_for_signal("other")
        g3 = await ctx.step.wait_for_signal("go")
        await ctx.step.run("after3", _hit, f"{ctx.run_id}:after3")
        g4 = await ctx.step.wait_for_signal("go")
        return {"go": [g1, g2, g3, g4], "other": o}

    return wf


def _timed() -> Workflow[Doc]:
    """a naps, then waits for go with a deadline (a timeout is an answer), then naps again."""
    wf = Workflow(f"mig2-timed-{_tag()}", input=Doc, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Doc]) -> Any:
        await ctx.step.run("first", _hit, f"{ctx.run_id}:first")
        await ctx.step.sleep("nap", 2.5)
        try:
            got = await ctx.step.wait_for_signal("go", timeout=2.5)
        except StepTimeoutError:
            got = "timeout"
        await ctx.step.sleep("nap2", 0.5)
        return {"got": got}

    return wf


def _echo() -> Workflow[Doc]:
    wf = Workflow(f"mig2-echo-{_tag()}", input=Doc, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Doc]) -> Any:
        ctx.emit("seen", {"b": 1, "a": 2})
        early = await ctx.step.wait_for_signal("go")
        got = await ctx.step.wait_for_signal("go")
        return {"input": ctx.input.doc, "early": early, "signal": got, "lit": {"b": 1, "a": 2}}

    return wf


class Side:
    def __init__(self, engine: WorkflowEngine, sink: MemorySink) -> None:
        self.engine, self.sink = engine, sink


@asynccontextmanager
async def _engines(
    tmp_path: Path, temporal_server: Any, registry: Registry, **temporal_options: Any
) -> AsyncIterator[dict[str, Side]]:
    blobs = f"file://{tmp_path / 'blobs'}"
    nsink, tsink = MemorySink(), MemorySink()
    native = create_engine(
        EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / f'wfe-{_tag()}.db'}",
            blob_url=blobs,
            lease_seconds=3.0,
        ),
        registry,
        event_sink=nsink,
    )
    temporal = create_engine(
        EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"m2-{_tag()}",
            blob_url=blobs,
        ),
        registry,
        event_sink=tsink,
        signal_timeout=1.0,
        **temporal_options,
    )
    async with native, temporal:
        yield {"native": Side(native, nsink), "temporal": Side(temporal, tsink)}


async def _until(what: str, probe: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _moved(sides: dict[str, Side], src: Side, target: str, run_id: str) -> Side:
    """Move the run from ``src`` to ``sides[target]`` (every event of the source delivered)."""
    dst = sides[target]
    move = await migrate_run(src.engine, dst.engine, run_id)
    assert move.outcome == "moved", move
    await _flushed(src, run_id)
    return dst


def _suspended_on(side: Side, run_id: str) -> list[Any]:
    return [e.data for e in side.sink.for_run(run_id) if e.type == "stage.suspended"]


async def _flushed(side: Side, run_id: str) -> None:
    """Every event the engine holds for the run reached its sink."""
    held = await side.engine.events(run_id)

    async def delivered() -> bool:
        await side.engine.flush_events()
        got = {e.id for e in side.sink.events if e.run_id == run_id}
        return all(e.id in got for e in held)

    await _until("events delivered", delivered)


def _check_ids(events: list[Event]) -> list[Event]:
    """No id names two different events; deduplicated by id, the run's events are numbered
    1..n without a gap (a consumer de-duplicating by id loses nothing)."""
    by_id: dict[str, tuple[Any, ...]] = {}
    for e in events:
        what = (e.seq, e.type, e.stage, e.data)
        assert by_id.setdefault(e.id, what) == what, (e.id, by_id[e.id], what)
    kept: dict[str, Event] = {}
    for e in events:
        kept.setdefault(e.id, e)
    ordered = sorted(kept.values(), key=lambda e: e.seq)
    assert [e.seq for e in ordered] == list(range(1, len(ordered) + 1)), [
        (e.seq, e.type, e.id) for e in ordered
    ]
    return ordered


# -- 1. several waits for one name, signals queued across the move --------------------------------


async def _multi_scenario(
    sides: dict[str, Side],
    wf: Workflow[Doc],
    source: str,
    target: str | None,
    before_last: Callable[[Side, str], Awaitable[None]] | None = None,
) -> tuple[Any, list[Event]]:
    """Start on ``source``; go{w:1} taken by the first wait; once a suspends on go#2, the
    worker stops, go{w:2}, other{w:o} and go{w:3} are queued, the run moves to ``target``
    (None: it stays), and there go{w:4} ends it (after ``before_last``). The run's output and
    every event either sink saw."""
    src = sides[source]
    run = await src.engine.start(wf.id, {"doc": {}})
    async with src.engine.worker():
        await _until("first wait", lambda: _n_suspended(src, run.id, 1))
        await src.engine.signal(run.id, "go", {"w": 1})
        await _until("second wait", lambda: _n_suspended(src, run.id, 2))
        await _flushed(src, run.id)
    await src.engine.signal(run.id, "go", {"w": 2})
    await src.engine.signal(run.id, "other", {"w": "o"})
    await src.engine.signal(run.id, "go", {"w": 3})
    dst = src if target is None else await _moved(sides, src, target, run.id)
    async with dst.engine.worker():
        await _until("fourth wait for go", lambda: _waits_for(dst, run.id, "go#4"))
        if before_last is not None:
            await before_last(dst, run.id)
        await dst.engine.signal(run.id, "go", {"w": 4})
        info = await dst.engine.wait(run.id, timeout=30)
        await _flushed(dst, run.id)
    assert info.status == RunStatus.COMPLETED, info
    events = [e for s in sides.values() for e in s.sink.events if e.run_id == run.id]
    return info, events


async def _n_suspended(side: Side, run_id: str, n: int) -> bool:
    return len(_suspended_on(side, run_id)) >= n and (
        (await side.engine.get_run(run_id)).status == RunStatus.SUSPENDED
    )


async def _waits_for(side: Side, run_id: str, step: str) -> bool:
    steps = await side.engine.steps(run_id)
    return any(s.name == step and not s.completed for s in steps)


@pytest.mark.parametrize("source,target", [("native", "temporal"), ("temporal", "native")])
async def test_each_wait_for_one_name_gets_its_own_signal_across_a_move(
    tmp_path: Path, temporal_server: Any, source: str, target: str
) -> None:
    wf = _multi_wait()
    async with _engines(tmp_path, temporal_server, Registry([wf])) as sides:
        ref, ref_events = await _multi_scenario(sides, wf, source, None)
        got, events = await _multi_scenario(sides, wf, source, target)
    want = {"go": [{"w": 1}, {"w": 2}, {"w": 3}, {"w": 4}], "other": {"w": "o"}}
    assert ref.output == want and got.output == want, (ref.output, got.output)
    for info in (ref, got):
        assert HITS[f"{info.id}:after1"] == 1 and HITS[f"{info.id}:after3"] == 1
    assert normalise(events, wf.graph()) == normalise(ref_events, wf.graph())
    moved = _check_ids(events)
    _check_ids(ref_events)
    assert [e.type for e in moved].count("run.migrated") == 1
    assert len(moved) == len(_check_ids(ref_events)) + 1


# -- 2. a move while a stage sleeps or its wait has a deadline ------------------------------------


@pytest.mark.parametrize("source,target", [("native", "temporal"), ("temporal", "native")])
@pytest.mark.parametrize("at", ["sleep:nap", "signal:go"])
async def test_a_move_during_a_timed_wait_keeps_its_wake_time(
    tmp_path: Path, temporal_server: Any, source: str, target: str, at: str
) -> None:
    wf = _timed()
    async with _engines(tmp_path, temporal_server, Registry([wf])) as sides:
        src, dst = sides[source], sides[target]
        run = await src.engine.start(wf.id, {"doc": {}})
        async with src.engine.worker():

            async def parked() -> bool:
                info = await src.engine.get_run(run.id)
                return info.status == RunStatus.SUSPENDED and info.stage("a").waiting_for == at

            await _until(at, parked)
            wake = (await src.engine.get_run(run.id)).stage("a").wake_at
            assert wake is not None
        move = await migrate_run(src.engine, dst.engine, run.id)
        assert move.outcome == "moved", move
        assert (await dst.engine.get_run(run.id)).stage("a").wake_at == wake
        await _flushed(src, run.id)
        async with dst.engine.worker():
            info = await dst.engine.wait(run.id, timeout=30)
            await _flushed(dst, run.id)
        assert info.status == RunStatus.COMPLETED and info.output == {"got": "timeout"}, info
        assert HITS[f"{run.id}:first"] == 1
        events = [e for s in sides.values() for e in s.sink.events if e.run_id == run.id]
        ordered = _check_ids(events)
        suspended = [e for e in ordered if e.type == "stage.suspended"]
        assert [e.data["waiting_for"] for e in suspended] == [
            "sleep:nap",
            "signal:go",
            "sleep:nap2",
        ]
        assert suspended[0 if at == "sleep:nap" else 1].data["until"] == wake.isoformat()
        assert all(e.data["until"] for e in suspended)


# -- 3. key order ---------------------------------------------------------------------------------


@pytest.mark.parametrize("source,target", [("native", "temporal"), ("temporal", "native")])
async def test_key_order_survives_a_move(
    tmp_path: Path, temporal_server: Any, source: str, target: str
) -> None:
    wf = _echo()
    async with _engines(tmp_path, temporal_server, Registry([wf])) as sides:
        src, dst = sides[source], sides[target]
        run = await src.engine.start(wf.id, {"doc": {"b": 1, "a": 2}})
        async with src.engine.worker():
            await _until("waits", lambda: _n_suspended(src, run.id, 1))
            await src.engine.signal(run.id, "go", {"b": 1, "a": 2})
            await _until("waits again", lambda: _n_suspended(src, run.id, 2))
        await src.engine.signal(run.id, "go", {"b": 1, "a": 2})
        move = await migrate_run(src.engine, dst.engine, run.id)
        assert move.outcome == "moved", move
        moved = await dst.engine.get_run(run.id)
        assert list(moved.input["doc"]) == ["b", "a"], moved.input
        async with dst.engine.worker():
            info = await dst.engine.wait(run.id, timeout=30)
        assert info.status == RunStatus.COMPLETED
        out = info.output
        keys = ("input", "early", "signal", "lit")
        assert [list(out[k]) for k in keys] == [["b", "a"]] * 4, out
        await _flushed(dst, run.id)
        seen = [e for e in dst.sink.for_run(run.id) if e.type == "seen"]
        assert [list(e.data) for e in seen] == [["b", "a"]], seen


# -- 4. an imported run that continues as new -----------------------------------------------------


async def test_an_imported_multi_wait_run_continues_as_new_on_temporal(
    tmp_path: Path, temporal_server: Any
) -> None:
    wf = _multi_wait()

    async def continued(side: Side, run_id: str) -> None:
        # (its last wait, go#4, is a safe point: the run continues there before go{w:4})
        temporal: Any = side.engine

        async def more() -> bool:
            query = f'WorkflowId = "{run_id}"'  # (a closed execution is listed a moment later)
            return len([ex async for ex in temporal._conn.list_workflows(query)]) > 1

        await _until("the imported run's continue as new", more, timeout=45)

    async with _engines(
        tmp_path, temporal_server, Registry([wf]), continue_as_new_events=1
    ) as sides:
        got, events = await _multi_scenario(sides, wf, "native", "temporal", continued)
    assert got.output == {"go": [{"w": 1}, {"w": 2}, {"w": 3}, {"w": 4}], "other": {"w": "o"}}
    assert HITS[f"{got.id}:after1"] == 1 and HITS[f"{got.id}:after3"] == 1
    _check_ids(events)


# -- two stages waiting for one name: one signal queued at the move --------------------------------


def _pair_wait() -> Workflow[Doc]:
    wf = Workflow(f"mig2-pair-{_tag()}", input=Doc, version="v1")

    @wf.stage
    async def b(ctx: StageContext[Doc]) -> Any:
        return await ctx.step.wait_for_signal("go")

    @wf.stage
    async def c(ctx: StageContext[Doc]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


async def _pair_scenario(
    sides: dict[str, Side], wf: Workflow[Doc], source: str, target: str | None
) -> tuple[Any, list[Event]]:
    src = sides[source]
    run = await src.engine.start(wf.id, {"doc": {}})
    async with src.engine.worker():
        await _until("both wait", lambda: _n_suspended(src, run.id, 2))
        await _flushed(src, run.id)
    await src.engine.signal(run.id, "go", {"w": 1})
    dst = src if target is None else await _moved(sides, src, target, run.id)
    async with dst.engine.worker():

        async def one_done() -> bool:
            info = await dst.engine.get_run(run.id)
            return sum(s.status == "completed" for s in info.stages) == 1

        await _until("one stage took the signal", one_done)
        await asyncio.sleep(0.5)
        await dst.engine.signal(run.id, "go", {"w": 2})
        info = await dst.engine.wait(run.id, timeout=30)
        await _flushed(dst, run.id)
    assert info.status == RunStatus.COMPLETED, info
    events = [e for s in sides.values() for e in s.sink.events if e.run_id == run.id]
    return info, events


@pytest.mark.parametrize("aborted", [False, True], ids=["moved", "export-aborted-first"])
async def test_a_signal_a_stage_took_before_the_freeze_wakes_no_second_waiter(
    tmp_path: Path, temporal_server: Any, aborted: bool
) -> None:
    """Temporal -> native, b and c both waiting for ``go``, one ``go`` sent while no worker
    runs, and a workflow-only worker (a migration helper) runs the signal's task before the
    freeze: the signal resumes b, whose attempt the freeze withdraws (b exported ``running``
    at its wait, the signal back in the queue). The native import woke c as well for that
    signal: c lost it to b and suspended again in the wait it was imported in, its
    suspension's id sent a second time under a new sequence number (a clean clone beside a
    CPU hog met this order in ``test_two_waits_for_one_name_one_signal_queued_at_the_move``).

    ``aborted``: an export is aborted after the signal's task: the first freeze withdraws b's
    attempt and frees the signal, the abort lets the run go on, and the signal resumes c as
    well (both attempts scheduled, no worker to run them). The move exports b and c
    ``running`` at their wait with one ``go`` queued. Both ran again on the native target:
    the one that lost the signal suspended again in its wait and sent that suspension's id
    (already sent at the source) a second time under a new sequence number."""
    wf = _pair_wait()
    async with _engines(tmp_path, temporal_server, Registry([wf])) as sides:
        src = sides["temporal"]
        run = await src.engine.start(wf.id, {"doc": {}})
        async with src.engine.worker():
            await _until("both wait", lambda: _n_suspended(src, run.id, 2))
            await _flushed(src, run.id)
        await src.engine.signal(run.id, "go", {"w": 1})
        engine: Any = src.engine
        await _moving.helper(engine, wf.id, "v1")
        handle = engine._conn.get_workflow_handle(run.id)

        async def signal_handled() -> bool:
            events = list((await handle.fetch_history()).events)
            at = max(i for i, e in enumerate(events) if e.HasField(_SIGNALED))
            return any(e.HasField(_TASK_COMPLETED) for e in events[at:])

        await _until("the signal's workflow task completed", signal_handled)
        if aborted:
            await src.engine.export_run(run.id, wait=30)
            await src.engine.abort_export(run.id)

            async def both_resumed() -> bool:
                info = await src.engine.get_run(run.id)
                return [s.status for s in info.stages] == ["running", "running"]

            await _until("the signal resumed c too", both_resumed)
        dst = await _moved(sides, src, "native", run.id)
        async with dst.engine.worker():

            async def one_done() -> bool:
                info = await dst.engine.get_run(run.id)
                return sum(s.status == "completed" for s in info.stages) == 1

            await _until("one stage took the signal", one_done)
            await dst.engine.signal(run.id, "go", {"w": 2})
            info = await dst.engine.wait(run.id, timeout=30)
            await _flushed(dst, run.id)
        events = [e for s in sides.values() for e in s.sink.events if e.run_id == run.id]
    assert info.status == RunStatus.COMPLETED, info
    assert sorted(info.output.values(), key=str) == [{"w": 1}, {"w": 2}], info.output
    ordered = _check_ids(events)
    assert [e.type for e in ordered].count("stage.suspended") == 2, [
        (e.seq, e.type, e.stage) for e in ordered
    ]


_SIGNALED = "workflow_execution_signaled_event_attributes"
_TASK_COMPLETED = "workflow_task_completed_event_attributes"


@pytest.mark.parametrize(
    "source,target",
    [("native", None), ("temporal", None), ("native", "temporal"), ("temporal", "native")],
)
async def test_two_waits_for_one_name_one_signal_queued_at_the_move(
    tmp_path: Path, temporal_server: Any, source: str, target: str | None
) -> None:
    wf = _pair_wait()
    async with _engines(tmp_path, temporal_server, Registry([wf])) as sides:
        info, events = await _pair_scenario(sides, wf, source, target)
    assert sorted(info.output.values(), key=str) == [{"w": 1}, {"w": 2}], info.output
    ordered = _check_ids(events)
    assert [e.type for e in ordered].count("stage.suspended") == 2, [
        (e.seq, e.type, e.stage) for e in ordered
    ]
