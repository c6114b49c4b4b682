"""Continue-as-new (``GraphWorkflow._continue``), what the other continue-as-new cases leave
out: a run deadline and a wait timeout that fall after the continue (both keep their absolute
time), a run on a worker with no event sink (its events parked), and a run imported into
Temporal from the native driver that continues there. Each continued run is compared with the
same run that never continued (run beside it, at the default threshold)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conformance._trace import normalise
from driver_temporal import TemporalEngine
from driver_temporal._workflow import START_MEMO
from engine_port import (
    EngineSettings,
    Event,
    FolderBlobStore,
    MemorySink,
    Registry,
    RunInfo,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)
from engine_port.errors import StepTimeoutError

from .conftest import EngineFactory
from .test_continue_as_new import Calls, In, executions, until

pytestmark = pytest.mark.temporal

# a run continues as new at its first safe point (a wait), then again only after a wait ended
ONCE = {"continue_as_new_events": 1}
RUN_S = 6.0  # the run timeout
WAIT_S = 6.0  # the signal wait's timeout
NAP_S = 3.0  # a sleep before the last continue: a restarted deadline would be NAP_S late
SIGNALS = 3
LATE_S = 2.0  # how late a timer may fire on this busy host
YOUNG_S = 1.0  # a run timeout due before a run continued within a second could go on

T = TypeVar("T")


def _ns() -> int:
    return time.monotonic_ns()


async def _both(ref: Awaitable[T], got: Awaitable[T]) -> tuple[T, T]:
    """Both at once; the first to fail stops the other (no run left behind the test)."""
    async with asyncio.TaskGroup() as group:
        first, second = group.create_task(_awaited(ref)), group.create_task(_awaited(got))
    return first.result(), second.result()


async def _awaited(it: Awaitable[T]) -> T:
    return await it


Drive = Callable[[TemporalEngine, RunInfo], Awaitable[RunInfo]]


async def _side_by_side(
    make_engine: EngineFactory,
    factory: Callable[[Calls], Workflow[In]],
    drive: Drive,
    *,
    sink: bool = True,
) -> list[tuple[RunInfo, list[Event], Calls, int, Workflow[In]]]:
    """The workflow run twice at once: at the default threshold (the reference, it never
    continues) and continuing as new; for each, the run when ``drive`` returned, its events
    (engine.events), what it called and its executions."""

    async def one(options: dict[str, Any]) -> tuple[RunInfo, list[Event], Calls, int, Any]:
        calls = Calls()
        wf = factory(calls)
        memory = MemorySink() if sink else None
        engine = make_engine(
            Registry([wf]), sink=memory, task_queue=f"more-{_ns()}", options=dict(options)
        )
        async with engine:
            run = await engine.start(wf, {"n": 1})
            async with engine.worker():
                info = await drive(engine, run)
            events = await engine.events(run.id)
            if memory is not None:
                delivered = sorted(
                    {e.id: e for e in memory.for_run(run.id)}.values(), key=lambda e: e.seq
                )
                assert [e.id for e in delivered] == [e.id for e in events]
            count = len(await executions(engine, run.id))
        return info, events, calls, count, wf

    ref, got = await _both(one({}), one(ONCE))
    assert ref[3] == 1, ref[3]
    assert got[3] > 1, got[3]
    return [ref, got]


def _trace(events: list[Event], wf: Workflow[In]) -> list[list[Any]]:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len({e.id for e in events}) == len(events)
    return normalise(events, wf.graph())


def deadline_workflow(calls: Calls) -> Workflow[In]:
    """a (compensated), then b: a journaled step, a nap (the run continues as new in it and
    again once it ended), then a wait for a signal never sent, within the run's timeout."""
    wf = Workflow(f"can-deadline-{_ns()}", input=In, version="v1", timeout=timedelta(seconds=RUN_S))

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        calls.hit("a")
        return "A"

    @a.compensation
    async def undo_a(ctx: StageContext[In], out: str) -> None:
        calls.hit(f"undo-a:{out}")

    @wf.stage(after=[a], signals=["go"])
    async def b(ctx: StageContext[In]) -> Any:
        await ctx.step.run("before", lambda: calls.hit("before"))
        await ctx.step.sleep("nap", NAP_S)
        got = await ctx.step.wait_for_signal("go")
        calls.hit("b")
        return got

    return wf


async def _kept_the_deadline(engine: TemporalEngine, run_id: str, last: Any, info: RunInfo) -> None:
    """The last execution of a run that continued as new (``last``, NAP_S into the run) holds
    the run's own deadline, RUN_S after the run began, not one RUN_S after it began itself:
    read from its start document (the ``wfe_start`` memo), whatever the host's load made of
    the timer's firing."""
    handle = engine._conn.get_workflow_handle(run_id, run_id=last.run_id)
    start = (await (await handle.describe()).memo())[START_MEMO]
    deadline = datetime.fromisoformat(start["deadline"])
    assert info.created_at is not None
    assert deadline >= info.created_at + timedelta(seconds=RUN_S), (deadline, info.created_at)
    assert deadline < last.start_time + timedelta(seconds=RUN_S), (deadline, last.start_time)


async def test_run_deadline_after_continue_as_new(make_engine: EngineFactory) -> None:
    """A run with a run timeout that continued as new while it waits on a signal ends at its
    deadline (not one restarted at the continue), failed with RunTimeoutError, b cancelled
    and a compensated: as the same run that never continued."""

    async def drive(engine: TemporalEngine, run: RunInfo) -> RunInfo:
        info = await engine.wait(run.id, timeout=60)
        # the run continued as new after its nap, well before its deadline: the deadline
        # fell in the last execution, which started NAP_S into the run
        found = await executions(engine, run.id)
        assert info.finished_at is not None and info.created_at is not None
        assert all(ex.start_time < info.finished_at for ex in found), (found, info)
        if len(found) > 1:
            assert (found[-1].start_time - info.created_at).total_seconds() >= NAP_S - 0.5
            await _kept_the_deadline(engine, run.id, found[-1], info)
        return info

    (ref, ref_events, ref_calls, _, wf), (got, events, calls, _, _) = await _side_by_side(
        make_engine, deadline_workflow, drive
    )
    for info in (ref, got):
        assert info.status == RunStatus.FAILED, info
        assert info.error is not None and info.error.type == "RunTimeoutError", info.error
        assert info.created_at is not None and info.finished_at is not None
        took = (info.finished_at - info.created_at).total_seconds()
        # (not before the deadline; how late after it is the host's load: that the deadline
        # was not restarted at the continue is read from the last execution, in ``drive``)
        assert took >= RUN_S, took
        assert [(s.id, s.status) for s in info.stages] == [
            ("a", "compensated"),
            ("b", "cancelled"),
        ]
    assert got.error is not None and ref.error is not None
    assert got.error.message.replace(got.id, ref.id) == ref.error.message
    assert calls.counts == ref_calls.counts == {"a": 1, "before": 1, "undo-a:A": 1}
    assert _trace(events, wf) == _trace(ref_events, wf)
    assert [e.type for e in events[-3:]] == ["stage.cancelled", "stage.compensated", "run.failed"]


def wait_timeout_workflow(calls: Calls) -> Workflow[In]:
    """w: a journaled step, then a signal wait of WAIT_S that times out (no signal); beside
    it z naps NAP_S (the run continues as new once both wait, and again once the nap
    ended, NAP_S into w's wait)."""
    wf = Workflow(f"can-wait-timeout-{_ns()}", input=In, version="v1")

    @wf.stage(signals=["go"])
    async def w(ctx: StageContext[In]) -> str:
        await ctx.step.run("before", lambda: calls.hit("before"))
        try:
            await ctx.step.wait_for_signal("go", timeout=WAIT_S)
        except StepTimeoutError:
            calls.hit("timed-out")
            return "late"
        return "got"

    @wf.stage
    async def z(ctx: StageContext[In]) -> str:
        await ctx.step.sleep("nap", NAP_S)
        calls.hit("z")
        return "rested"

    return wf


async def test_wait_timeout_after_continue_as_new(make_engine: EngineFactory) -> None:
    """A signal wait with a timeout, during which the run continued as new, times out at the
    absolute time fixed when it began (the ``until`` of its stage.suspended), not at one
    restarted at the continue: the body gets StepTimeoutError, as in the run that never
    continued."""

    async def drive(engine: TemporalEngine, run: RunInfo) -> RunInfo:
        async def napped() -> bool:
            return (await engine.get_run(run.id)).stage("z").status == "completed"

        await until("z's nap", napped)
        if len(await executions(engine, run.id)) > 1:
            # the continued twin goes on in a new execution once the nap ended; there w
            # still waits, until the time it waited for from the first
            z_done = (await engine.get_run(run.id)).stage("z").finished_at
            assert z_done is not None

            async def went_on() -> bool:
                return bool((await executions(engine, run.id))[-1].start_time > z_done)

            await until("a continue after the nap", went_on)
        (suspended,) = [
            e for e in await engine.events(run.id) if e.type == "stage.suspended" and e.stage == "w"
        ]
        waiting = (await engine.get_run(run.id)).stage("w")
        assert waiting.status == "suspended" and waiting.waiting_for == "signal:go", waiting
        assert waiting.wake_at == datetime.fromisoformat(suspended.data["until"]), waiting
        info = await engine.wait(run.id, timeout=60)
        found = await executions(engine, run.id)
        if len(found) > 1:
            # the last continue came NAP_S into w's wait: a restarted timeout fires NAP_S late
            began = info.stage("w").started_at
            assert began is not None
            assert (found[-1].start_time - began).total_seconds() >= NAP_S - 0.5, found
        return info

    (ref, ref_events, ref_calls, _, wf), (got, events, calls, _, _) = await _side_by_side(
        make_engine, wait_timeout_workflow, drive
    )
    for info, evs in ((ref, ref_events), (got, events)):
        assert info.status == RunStatus.COMPLETED, info
        assert info.output == {"w": "late", "z": "rested"}, info.output
        (suspended,) = [e for e in evs if e.type == "stage.suspended" and e.stage == "w"]
        until_at = datetime.fromisoformat(suspended.data["until"])
        # the deadline is WAIT_S after the wait began in the activity; the event is dated by
        # the workflow task that recorded the suspension, a moment later (0.54 s on a loaded
        # CI host): at most WAIT_S, never a timeout restarted at a continue (NAP_S more)
        waited = (until_at - suspended.at).total_seconds()
        assert WAIT_S - 2.0 <= waited <= WAIT_S + 0.5, waited
        finished = info.stage("w").finished_at
        assert finished is not None and finished >= until_at
        assert (finished - until_at).total_seconds() < LATE_S, (finished, until_at)
    assert calls.counts == ref_calls.counts == {"before": 1, "timed-out": 1, "z": 1}
    assert _trace(events, wf) == _trace(ref_events, wf)


def signals_workflow(calls: Calls) -> Workflow[In]:
    """a, then b: a journaled step, then SIGNALS waits for the signal ``go``."""
    wf = Workflow(f"can-more-signals-{_ns()}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        calls.hit("a")
        return "A"

    @wf.stage(after=[a], signals=["go"])
    async def b(ctx: StageContext[In]) -> int:
        await ctx.step.run("before", lambda: calls.hit("before"))
        total = 0
        for _ in range(SIGNALS):
            total += int((await ctx.step.wait_for_signal("go", timeout=600))["v"])
        calls.hit("b")
        return total

    return wf


async def _signal_each(
    engine: TemporalEngine, run_id: str, suspensions: Callable[[], Awaitable[int]]
) -> RunInfo:
    """Send b's signals one at a time, each once b suspended for it (so that every run takes
    the same path); the run once it ended."""
    for i in range(SIGNALS):

        async def suspended(k: int = i) -> bool:
            return await suspensions() >= k + 1

        await until(f"the wait for signal {i}", suspended)
        await engine.signal(run_id, "go", {"v": i}, idempotency_key=f"k{i}")
    return await engine.wait(run_id, timeout=60)


def _suspended(events: list[Event]) -> int:
    return sum(1 for e in events if e.type == "stage.suspended")


async def test_continue_as_new_without_an_event_sink(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    """A run on an engine with no event sink (its events parked in the BlobStore, the start
    document's ``parked``) that continued as new (at its waits): once it completed,
    ``events()`` returns each of its events once, seq 1..n, as the same run's that never
    continued; an engine with a sink delivers them (``flush_events``) each once."""

    async def drive(engine: TemporalEngine, run: RunInfo) -> RunInfo:
        async def suspensions() -> int:
            return _suspended(await engine.events(run.id))

        info = await _signal_each(engine, run.id, suspensions)
        if len(await executions(engine, run.id)) > 1:
            # the last execution started from a continue, told its events were parked, or
            # (``continue_carries_events``) carrying the continuing task's events, not handed
            # over yet: its first task hands them over, told what the run had parked, and
            # counts on parked events from then on, as the continuing task did before
            memo = await (await engine._conn.get_workflow_handle(run.id).describe()).memo()
            start = memo["wfe_start"]
            carried = (await engine._started_with(run.id)).get("outbox")
            assert start.get("continued") is True, start
            assert start.get("parked") is True or carried, (start, carried)
        return info

    (ref, ref_events, ref_calls, _, wf), (got, events, calls, _, _) = await _side_by_side(
        make_engine, signals_workflow, drive, sink=False
    )
    for info in (ref, got):
        assert info.status == RunStatus.COMPLETED, info
        assert info.output == sum(range(SIGNALS)), info.output
    assert calls.counts == ref_calls.counts == {"a": 1, "before": 1, "b": 1}
    assert _trace(events, wf) == _trace(ref_events, wf)
    assert events[0].type == "run.created" and events[-1].type == "run.completed"

    for info in (ref, got):  # (parked: in the BlobStore until an engine with a sink flushes)
        assert await FolderBlobStore(blob_dir).list(f"outbox/{info.id}/"), info.id
    sink = MemorySink()
    flusher = make_engine(Registry([wf]), sink=sink, task_queue=f"flush-{_ns()}")
    async with flusher:
        await flusher.flush_events()
    for info, evs in ((ref, ref_events), (got, events)):
        delivered = sink.for_run(info.id)
        assert [e.id for e in delivered] == [e.id for e in evs], info.id
        assert not await FolderBlobStore(blob_dir).list(f"outbox/{info.id}/")


async def _imported(
    make_engine: EngineFactory,
    tmp_path: Path,
    blob_dir: Path,
    factory: Callable[[Calls], Workflow[In]],
    at: str,
    drive: Callable[[TemporalEngine, str, MemorySink], Awaitable[RunInfo]],
    options: dict[str, Any],
) -> dict[str, Any]:
    """A run of ``factory`` started on the native driver (SQLite), moved into Temporal once
    b waits (``at``), then driven there to its end; what it did. Its events, native's then
    Temporal's (every execution), are numbered on without a gap, each delivered once."""
    calls = Calls()
    wf = factory(calls)
    registry = Registry([wf])
    sink = MemorySink()
    engine = make_engine(registry, sink=sink, task_queue=f"imp-{_ns()}", options=dict(options))
    native: Any = create_engine(
        EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / f'wfe-{_ns()}.db'}",
            blob_url=f"file://{blob_dir}",
            lease_seconds=1.0,
        ),
        registry,
        event_sink=sink,
    )
    async with native, engine:
        run = await native.start(wf, {"n": 1})
        # (the native worker delivers native's events, its run.migrated too)
        async with native.worker():

            async def waits() -> bool:
                return bool((await native.get_run(run.id)).stage("b").waiting_for == at)

            await until(f"b's wait {at}, on native", waits)
            snapshot = await native.export_run(run.id, wait=10)
            await engine.import_run(snapshot)
            moved = await native.complete_export(run.id, engine.driver_name)
            assert moved.status == RunStatus.MIGRATED, moved
            async with engine.worker():
                info = await drive(engine, run.id, sink)

            async def delivered_all() -> bool:
                return any(e.type == "run.migrated" for e in sink.for_run(run.id))

            await until("native's run.migrated delivered", delivered_all, timeout=20)
        theirs, mine = await native.events(run.id), await engine.events(run.id)
        assert theirs[-1].type == "run.migrated", theirs[-1]
        both = theirs + mine
        assert [e.seq for e in both] == list(range(1, len(both) + 1))
        delivered = sorted({e.id: e for e in sink.for_run(run.id)}.values(), key=lambda e: e.seq)
        assert [e.id for e in delivered] == [e.id for e in both]
        return {
            "info": info,
            "trace": normalise(both, wf.graph()),
            "calls": dict(calls.counts),
            "steps": [(s.stage, s.name, s.completed) for s in await engine.steps(run.id)],
            "executions": await executions(engine, run.id),
            "native": len(theirs),
        }


async def test_imported_run_continues_as_new(
    make_engine: EngineFactory, tmp_path: Path, blob_dir: Path
) -> None:
    """A run moved into Temporal from the native driver (SQLite) while b waits for its first
    signal, that then continues as new there (at its waits), completes: its events
    (native's, then Temporal's, every execution) numbered on without a gap, each once, as
    the same imported run's that never continued; its output right; its journaled step and
    the stage a native ran not run again."""

    async def drive(engine: TemporalEngine, run_id: str, sink: MemorySink) -> RunInfo:
        async def suspensions() -> int:
            return _suspended(sink.for_run(run_id))

        return await _signal_each(engine, run_id, suspensions)

    ref, got = await _both(
        *(
            _imported(make_engine, tmp_path, blob_dir, signals_workflow, "signal:go", drive, o)
            for o in ({}, ONCE)
        )
    )
    assert len(ref["executions"]) == 1 and len(got["executions"]) > 1
    for out in (ref, got):
        info = out["info"]
        assert info.status == RunStatus.COMPLETED and info.output == sum(range(SIGNALS)), info
        assert out["calls"] == {"a": 1, "before": 1, "b": 1}
    for key in ("trace", "steps", "native"):
        assert got[key] == ref[key], key


async def test_imported_run_deadline_after_continue_as_new(
    make_engine: EngineFactory, tmp_path: Path, blob_dir: Path
) -> None:
    """A run with a run timeout moved into Temporal from the native driver while b naps,
    that continues as new there (in the nap and once it ended): it ends at the deadline the
    native driver fixed, failed with RunTimeoutError and compensated, as the same imported
    run that never continued."""

    async def drive(engine: TemporalEngine, run_id: str, sink: MemorySink) -> RunInfo:
        info = await engine.wait(run_id, timeout=60)
        found = await executions(engine, run_id)
        if len(found) > 1:
            await _kept_the_deadline(engine, run_id, found[-1], info)
        return info

    ref, got = await _both(
        *(
            _imported(make_engine, tmp_path, blob_dir, deadline_workflow, "sleep:nap", drive, o)
            for o in ({}, ONCE)
        )
    )
    assert len(ref["executions"]) == 1 and len(got["executions"]) > 1
    for out in (ref, got):
        info = out["info"]
        assert info.status == RunStatus.FAILED, info
        assert info.error is not None and info.error.type == "RunTimeoutError", info.error
        assert info.created_at is not None and info.finished_at is not None
        took = (info.finished_at - info.created_at).total_seconds()
        assert took >= RUN_S, took  # (not restarted at a continue: ``drive``)
        assert out["calls"] == {"a": 1, "before": 1, "undo-a:A": 1}
    last = got["executions"][-1].start_time - got["info"].created_at
    assert last.total_seconds() >= NAP_S - 0.5, got["executions"]
    for key in ("trace", "steps", "native"):
        assert got[key] == ref[key], key


def young_workflow(calls: Calls, *, wait_s: float | None) -> Workflow[In]:
    """a (compensated), then b waits for a signal never sent; within a run timeout of
    YOUNG_S (``wait_s`` None) or a wait timeout of ``wait_s``: a timer due within about a
    second of the run's start, while a continue-as-new could not start its new execution."""
    timeout = timedelta(seconds=YOUNG_S) if wait_s is None else None
    wf = Workflow(f"can-young-{_ns()}", input=In, version="v1", timeout=timeout)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        calls.hit("a")
        return "A"

    @a.compensation
    async def undo_a(ctx: StageContext[In], out: str) -> None:
        calls.hit(f"undo-a:{out}")

    @wf.stage(after=[a], signals=["go"])
    async def b(ctx: StageContext[In]) -> str:
        try:
            await ctx.step.wait_for_signal("go", timeout=wait_s)
        except StepTimeoutError:
            return "late"
        return "got"

    return wf


@pytest.mark.parametrize("timer", ["run", "wait"])
async def test_a_timer_due_before_a_new_execution_could_run_fires_on_time(
    make_engine: EngineFactory, timer: str
) -> None:
    """Temporal runs the first task of an execution that continued from one younger than a
    second (its ContinueAsNewMinInterval) about a second after the continue: a run deadline
    or a wait timeout due meanwhile fired that late (1-1.5 s after the same run's that
    never continued, which the last assertion caught). An execution that young does not
    continue while such a timer is due before the new one could run: the timer fires on
    time, and the run ends as the one that never continued."""

    def factory(calls: Calls) -> Workflow[In]:
        return young_workflow(calls, wait_s=None if timer == "run" else 0.6)

    async def drive(engine: TemporalEngine, run: RunInfo) -> RunInfo:
        return await engine.wait(run.id, timeout=60)

    async def one(options: dict[str, Any]) -> tuple[RunInfo, list[list[Any]], Calls]:
        calls = Calls()
        wf = factory(calls)
        engine = make_engine(Registry([wf]), task_queue=f"young-{_ns()}", options=dict(options))
        async with engine:
            run = await engine.start(wf, {"n": 1})
            async with engine.worker():
                info = await drive(engine, run)
            return info, _trace(await engine.events(run.id), wf), calls

    (ref, ref_trace, ref_calls), (got, trace, calls) = await _both(one({}), one(ONCE))
    assert (got.status, got.output, got.error and got.error.type) == (
        ref.status,
        ref.output,
        ref.error and ref.error.type,
    )
    assert trace == ref_trace and calls.counts == ref_calls.counts
    took: list[float] = []
    for info in (ref, got):
        assert info.created_at is not None and info.finished_at is not None
        took.append((info.finished_at - info.created_at).total_seconds())
    assert took[1] - took[0] < 0.7, took
