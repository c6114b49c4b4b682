"""A run an operator terminates in Temporal (``temporal workflow terminate``) could not emit its
closing event itself: the engine's workers notice it (``_ended``) and publish its ``run.failed``
(error ``RunTerminatedError`` with the operator's reason), once, as the native driver's run
would have, so a consumer of the event stream hears that the run ended."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from driver_temporal import _ended, _run_end
from engine_port import Event, MemorySink, Registry, StageContext, Workflow

from .conftest import EngineFactory, trace, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


class Passes:
    """Counts the passes of the workers' ``EndedOutside.scan``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        scan = _ended.EndedOutside.scan

        async def counted(ended: _ended.EndedOutside) -> int:
            try:
                return await scan(ended)
            finally:
                self.n += 1

        monkeypatch.setattr(_ended.EndedOutside, "scan", counted)
        monkeypatch.setattr(_ended, "SCAN_EVERY_S", 0.2)

    async def more(self, k: int, timeout: float = 60.0) -> None:
        """Wait until ``k`` more passes have run."""
        loop = asyncio.get_running_loop()
        target, deadline = self.n + k, loop.time() + timeout
        while self.n < target:
            assert loop.time() < deadline, f"only {self.n} of {target} passes ran"
            await asyncio.sleep(0.05)


# a held run terminated by an operator while it waited, then redriven and released
_FAILED_THEN_REDRIVEN = [
    "run.created",
    "run.started",
    "stage.started",
    "stage.suspended",
    "run.failed",
    "run.redriven",
    "stage.started",
    "stage.suspended",
    "stage.completed",
    "run.completed",
]


def _held(wf_id: str) -> Workflow[In]:
    wf = Workflow(wf_id, input=In)

    @wf.stage
    async def hold(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("release")

    return wf


def _closing(sink: MemorySink, run_id: str) -> list[Any]:
    return [e for e in sink.events if e.run_id == run_id and e.type == "run.failed"]


async def test_a_terminated_run_publishes_its_closing_event_once(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes = Passes(monkeypatch)
    sink = MemorySink()
    engine = make_engine(Registry([_held("term-ev")]), sink=sink)
    async with engine:
        async with engine.worker():
            run = await engine.start("term-ev", {})
            await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
            await engine._conn.get_workflow_handle(run.id).terminate(
                reason="stuck order, ops ticket 42"
            )
            await wait_for_event(sink, run.id, "run.failed", timeout=60)
            await passes.more(3)
        info = await engine.get_run(run.id)
        # engine.events lists it too, as on native (the histories alone end before it)
        listed = [(e.id, e.seq) for e in await engine.events(run.id)]
        assert listed == [(e.id, e.seq) for e in sink.events if e.run_id == run.id]
        # a worker started later (nothing in memory) does not send it again either
        async with engine.worker():
            await passes.more(3)
    assert info.status == "failed" and info.error is not None
    assert trace(sink, run) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "hold"),
        ("stage.suspended", "hold"),
        ("run.failed", None),
    ]
    [closing] = _closing(sink, run.id)
    assert closing.data == {
        "error": {"type": "RunTerminatedError", "message": info.error.message, "stage": None}
    }
    assert "stuck order, ops ticket 42" in closing.data["error"]["message"]
    assert info.error.type == "RunTerminatedError"


async def test_a_run_terminated_while_no_worker_runs_is_announced_by_the_next(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes = Passes(monkeypatch)
    sink = MemorySink()
    engine = make_engine(Registry([_held("term-ev-later")]), sink=sink)
    async with engine:
        async with engine.worker():
            run = await engine.start("term-ev-later", {})
            await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        await engine._conn.get_workflow_handle(run.id).terminate(reason="ops")
        assert _closing(sink, run.id) == []
        async with engine.worker():
            await wait_for_event(sink, run.id, "run.failed", timeout=60)
            await passes.more(3)
    assert [t for t, _ in trace(sink, run)][-1] == "run.failed"
    assert len(_closing(sink, run.id)) == 1


async def test_a_redriven_run_is_not_announced_late(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Terminated and redriven before any worker looked: the redrive's events follow, and no
    run.failed comes after them."""
    passes = Passes(monkeypatch)
    sink = MemorySink()
    engine = make_engine(Registry([_held("term-ev-redrive")]), sink=sink)
    async with engine:
        async with engine.worker():
            run = await engine.start("term-ev-redrive", {})
            await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        await engine._conn.get_workflow_handle(run.id).terminate(reason="ops")
        await engine.redrive(run.id)
        async with engine.worker():
            await wait_for_event(sink, run.id, "run.redriven", timeout=60)
            await engine.signal(run.id, "release", "go")
            done = await engine.wait(run.id, timeout=60)
            await passes.more(3)
    assert done.status == "completed"
    assert _closing(sink, run.id) == []


async def test_a_redrive_after_the_closing_event_numbers_its_events_after_it(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on the native driver: run.failed, then the redrive's run.redriven, one sequence."""
    Passes(monkeypatch)
    sink = MemorySink()
    engine = make_engine(Registry([_held("term-ev-after")]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("term-ev-after", {})
        await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        await engine._conn.get_workflow_handle(run.id).terminate(reason="ops")
        await wait_for_event(sink, run.id, "run.failed", timeout=60)
        await engine.redrive(run.id)
        await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        await engine.signal(run.id, "release", "go")
        done = await engine.wait(run.id, timeout=60)
    assert done.status == "completed"
    assert [t for t, _ in trace(sink, run)] == _FAILED_THEN_REDRIVEN


class TerminatingSink(MemorySink):
    """A sink that, on receiving a run's first ``stage.suspended``, has Temporal terminate the
    run (``reason``) and returns only once it is terminated, as does every later delivery for
    the run until then: the workflow task that hands the event over to its worker cannot
    complete before the terminate (its completion is refused), as on a loaded host where the
    terminate overtook the task. Deterministic: nothing here depends on the host's load."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason
        self.engine: Any = None
        self.terminated: dict[str, asyncio.Future[Any]] = {}

    async def publish(self, events: Sequence[Event]) -> None:
        await super().publish(events)  # received, whatever becomes of the task
        for e in events:
            if e.type == "stage.suspended" and e.run_id not in self.terminated:
                handle = self.engine._conn.get_workflow_handle(e.run_id)
                self.terminated[e.run_id] = asyncio.ensure_future(
                    handle.terminate(reason=self.reason)
                )
        for run_id in {e.run_id for e in events} & set(self.terminated):
            # (shielded: a sink the worker stopped waiting for leaves the terminate going)
            await asyncio.shield(self.terminated[run_id])


def _interrupting(
    monkeypatch: pytest.MonkeyPatch, make_engine: EngineFactory, wf: Workflow[In]
) -> tuple[TerminatingSink, Any]:
    sink = TerminatingSink("ops, mid-task")
    engine = make_engine(Registry([wf]), sink=sink)
    sink.engine = engine
    # the worker waits for the sink longer than the workflow thread waits for the worker: a
    # slow terminate fails the task (WorkerFault, retried: its retry waits for the sink too),
    # it never lets it complete with the events kept for later
    monkeypatch.setattr(_run_end, "_HAND_WITHIN_S", 5.0)
    return sink, engine


async def _interrupted(engine: Any, run_id: str) -> None:
    """Assert the workflow task that handed ``stage.suspended`` over never completed: the
    execution's history ends with a task started after the last completed one, then the
    terminate (what made the memo and the committed tasks lag the sink)."""
    history = await engine._conn.get_workflow_handle(run_id).fetch_history()
    kinds = [e.event_type for e in history.events]
    assert kinds[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED, kinds
    started = max(i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED)
    done = max(i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    assert started > done, [EventType.Name(k) for k in kinds]


async def test_a_run_terminated_while_its_task_delivers_events_closes_after_them(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The terminate lands while the workflow task that delivered ``stage.suspended`` (4) runs:
    no completed task, nor the memo, counts that event, yet the sink has it. The closing
    event comes after it (5, not a second 4), ``engine.events`` lists what the sink received,
    and a redrive's events follow the closing event."""
    Passes(monkeypatch)
    sink, engine = _interrupting(monkeypatch, make_engine, _held("term-ev-mid"))
    async with engine, engine.worker():
        run = await engine.start("term-ev-mid", {})
        await wait_for_event(sink, run.id, "run.failed", timeout=60)
        await _interrupted(engine, run.id)
        assert [(e.seq, e.type) for e in sink.for_run(run.id)] == [
            (1, "run.created"),
            (2, "run.started"),
            (3, "stage.started"),
            (4, "stage.suspended"),
            (5, "run.failed"),
        ]
        assert await engine.events(run.id) == sink.for_run(run.id)
        await engine.redrive(run.id)
        await wait_for_event(sink, run.id, "run.redriven", timeout=60)
        await engine.signal(run.id, "release", "go")
        done = await engine.wait(run.id, timeout=60)
        await wait_for_event(sink, run.id, "run.completed", timeout=60)
        assert await engine.events(run.id) == sink.for_run(run.id)
    assert done.status == "completed"
    # (trace: seq 1..n, no number twice)
    assert [t for t, _ in trace(sink, run)] == _FAILED_THEN_REDRIVEN
    assert len(_closing(sink, run.id)) == 1


async def test_a_redrive_before_any_closing_event_numbers_its_events_after_the_task(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Terminated while its task delivered ``stage.suspended`` (4), redriven before any worker
    announced it: the redrive's run.redriven is 5 (its memo says 3)."""

    async def no_pass(ended: _ended.EndedOutside) -> int:
        return 0

    monkeypatch.setattr(_ended.EndedOutside, "scan", no_pass)
    sink, engine = _interrupting(monkeypatch, make_engine, _held("term-ev-mid-redrive"))
    async with engine, engine.worker():
        run = await engine.start("term-ev-mid-redrive", {})
        await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        await sink.terminated[run.id]
        await _interrupted(engine, run.id)
        await engine.redrive(run.id)
        await wait_for_event(sink, run.id, "run.redriven", timeout=60)
        await engine.signal(run.id, "release", "go")
        done = await engine.wait(run.id, timeout=60)
        await wait_for_event(sink, run.id, "run.completed", timeout=60)
        assert await engine.events(run.id) == sink.for_run(run.id)
    assert done.status == "completed"
    assert [t for t, _ in trace(sink, run)] == [
        "run.created",
        "run.started",
        "stage.started",
        "stage.suspended",
        "run.redriven",
        "stage.started",
        "stage.suspended",
        "stage.completed",
        "run.completed",
    ]
