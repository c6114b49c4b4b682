"""``TemporalEngine.events(run_id)``: the run's event stream rebuilt from its workflow
histories equals what the EventSink received (ids, types, order, data, times), as the native
driver's ``events`` reads its outbox. Covers events carried by stage activities, those of the
``wfe.publish`` / ``wfe.save_state`` local activities (not stored in the history: a local
activity's marker keeps its result only), a ``local=True`` stage, and a redrive (a second
execution of the same workflow id)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent, WorkflowTaskFailedEventAttributes
from temporalio.client import WorkflowHistory

from driver_temporal._carry import meta_of
from driver_temporal._history_events import committed, emitted, replay_events
from engine_port import MemorySink, Registry, Retry, StageContext, Workflow
from engine_port.errors import RunNotFoundError

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal
HISTORIES = Path(__file__).parent / "histories"


class In(BaseModel):
    n: int


def order_flow(fail_first: dict[str, int]) -> Workflow[In]:
    wf = Workflow("hist-events", input=In)

    @wf.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=50)))
    async def flaky(ctx: StageContext[In]) -> int:
        if fail_first["flaky"] > 0:
            fail_first["flaky"] -= 1
            raise RuntimeError("first attempt fails")
        ctx.emit("order.reserved", {"n": ctx.input.n})
        return ctx.input.n

    @wf.stage(after=[flaky], local=True)
    async def note(ctx: StageContext[In]) -> str:
        ctx.emit("order.noted", {"by": "local"})
        return "noted"

    @wf.stage(after=[note])
    async def approve(ctx: StageContext[In]) -> dict[str, object]:
        decision = await ctx.step.wait_for_signal("approval")
        ctx.emit("order.approved", decision)
        return dict(decision)

    @wf.stage(after=[approve], retry=Retry(max_attempts=2, initial_interval=timedelta(0)))
    async def ship(ctx: StageContext[In]) -> str:
        if fail_first["ship"] > 0:
            fail_first["ship"] -= 1
            raise RuntimeError("ship fails for good")
        return "shipped"

    return wf


async def test_events_equal_what_the_sink_received(make_engine: EngineFactory) -> None:
    sink = MemorySink()
    engine = make_engine(Registry([order_flow({"flaky": 1, "ship": 0})]), sink=sink)
    async with engine:
        run = await engine.start("hist-events", {"n": 7})
        async with engine.worker():
            await wait_for_event(sink, run.id, "stage.suspended")
            waiting = await engine.events(run.id)
            await engine.signal(run.id, "approval", {"ok": True})
            info = await engine.wait(run.id, timeout=30)
            assert info.status == "completed", info
            await wait_for_event(sink, run.id, "run.completed")
        events = await engine.events(run.id)
    received = sink.for_run(run.id)
    assert [e.type for e in events] == [e.type for e in received]
    assert [e.id for e in events] == [e.id for e in received]
    assert events == received  # data, stage, seq, times, business flag too
    types = [(e.type, e.stage) for e in events]
    assert ("stage.failed", "flaky") in types
    assert types.count(("stage.started", "flaky")) == 2
    assert [e.type for e in events if e.business] == [
        "order.reserved",
        "order.noted",
        "order.approved",
    ]
    assert events[-1].type == "run.completed"
    # read while the run waited: what the run had emitted then, the same events
    assert ("stage.suspended", "approve") in [(e.type, e.stage) for e in waiting]
    assert waiting == events[: len(waiting)]


async def test_events_span_a_redrive(make_engine: EngineFactory) -> None:
    sink = MemorySink()
    fails = {"flaky": 0, "ship": 2}
    engine = make_engine(Registry([order_flow(fails)]), sink=sink)
    async with engine:
        run = await engine.start("hist-events", {"n": 1})
        async with engine.worker():
            await engine.signal(run.id, "approval", {"ok": True})
            failed = await engine.wait(run.id, timeout=30)
            assert failed.status == "failed", failed
            await wait_for_event(sink, run.id, "run.failed")
            fails["ship"] = 0
            await engine.redrive(run.id, from_="last_failure")
            done = await engine.wait(run.id, timeout=30)
            assert done.status == "completed", done
            await wait_for_event(sink, run.id, "run.completed")
        events = await engine.events(run.id)
    received = sink.for_run(run.id)
    assert events == received
    types = [e.type for e in events]
    assert types.index("run.failed") < types.index("run.redriven") < types.index("run.completed")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_events_of_an_unknown_run(make_engine: EngineFactory) -> None:
    engine = make_engine(Registry([order_flow({"flaky": 0, "ship": 0})]))
    async with engine:
        with pytest.raises(RunNotFoundError):
            await engine.events("no-such-run-0123")


def _recorded(name: str) -> WorkflowHistory:
    data = json.loads((HISTORIES / f"{name}.json").read_text())
    return WorkflowHistory.from_json(data["workflow_id"], data["history"])


def _carried(history: WorkflowHistory) -> list[dict[str, Any]]:
    """The events stored in the history: those stage activities carry in their input."""
    out: list[dict[str, Any]] = []
    for ev in history.events:
        if ev.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        first = ev.activity_task_scheduled_event_attributes.input.payloads[0]
        meta = meta_of(first)
        task = meta if meta is not None else json.loads(first.data)
        out += (task.get("publish") or {}).get("events") or []
    return out


@pytest.mark.parametrize(
    "name",
    [
        "events_via_activities_resume",
        "publish_per_task_resume",
        "after_locals_resume",
        "run_end_by_worker_resume",
    ],
)
async def test_recorded_histories_give_every_event(name: str) -> None:
    """Recorded runs (no server): the replay gives each event the history stores as it is
    stored, and the ones it does not store (those of wfe.publish / wfe.save_state)."""
    history = _recorded(name)
    events = await replay_events([history])
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "run.created" and events[-1].type == "run.completed"
    dumped = {e.id: e.model_dump(mode="json") for e in events}
    stored = _carried(history)
    for e in stored:
        assert dumped[e["id"]] == e
    assert "run.completed" not in {e["type"] for e in stored}  # only the replay has it


@pytest.mark.parametrize(
    "name",
    [
        "events_via_activities_resume",
        "publish_per_task_resume",
        "after_locals_resume",
        "run_end_by_worker_resume",
        "local_chain",
    ],
)
async def test_a_history_read_at_any_point_gives_a_prefix(name: str) -> None:
    """A run read while it runs (its history cut after any event) gives the events its
    completed workflow tasks emitted: a prefix of the final stream, times included (an
    activity completion recorded after the last completed task is left to the next task)."""
    history = _recorded(name)
    full = await replay_events([history])
    seen = 0
    for n in range(1, len(history.events) + 1):
        cut = WorkflowHistory(history.workflow_id, list(history.events)[:n])
        partial = await replay_events([cut])
        assert partial == full[: len(partial)], f"cut after event {n}"
        assert len(partial) >= seen
        seen = len(partial)
    assert seen == len(full)


async def test_a_workflow_task_in_flight_is_left_out() -> None:
    history = _recorded("events_via_activities_resume")
    full = await replay_events([history])
    started = [
        i
        for i, ev in enumerate(history.events)
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    ]
    # cut at the last task's start: that task (the run's end) has not completed
    cut = WorkflowHistory(history.workflow_id, list(history.events)[: started[-1] + 1])
    assert len(committed(cut).events) < len(cut.events)
    partial = await replay_events([cut])
    assert partial == full[: len(partial)]
    assert "run.completed" not in [e.type for e in partial]


def _closed_during(history: WorkflowHistory, started: int, how: EventType.ValueType) -> Any:
    """``history`` cut at its event index ``started`` (a ``WorkflowTaskStarted``), then closed
    by Temporal as a terminate does while that task runs (the task force-failed, then the
    close ``how``)."""
    events = list(history.events)[: started + 1]
    task = events[-1]
    failed = HistoryEvent(
        event_id=task.event_id + 1,
        event_type=EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
        workflow_task_failed_event_attributes=WorkflowTaskFailedEventAttributes(
            scheduled_event_id=task.workflow_task_started_event_attributes.scheduled_event_id,
            started_event_id=task.event_id,
            cause=WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND,
        ),
    )
    closing = HistoryEvent(event_id=task.event_id + 2, event_type=how)
    return WorkflowHistory(history.workflow_id, [*events, failed, closing])


@pytest.mark.parametrize(
    ("name", "whole_task"),
    [
        ("events_via_activities_resume", True),
        ("publish_per_task_resume", True),  # (wfe.publish, a local activity, at every task)
        ("after_locals_resume", True),
        ("run_end_by_worker_resume", True),
        ("events_handed_resume", True),
        ("upgrade_suspends", True),
        ("local_chain", False),  # (what a task does with a local stage's result: not recorded)
    ],
)
async def test_a_task_a_terminate_interrupted_counts(name: str, whole_task: bool) -> None:
    """An execution Temporal closed (terminated, timed out) while a workflow task ran: the
    task never completes, yet the worker running it may have delivered its events, and no
    other task emits them. The replay gives them: the events that task emits when it
    completes (the recorded run's), as it emitted them (times too), up to the first local
    activity it awaits (``whole_task`` False: a task of ``local=True`` stages)."""
    history = _recorded(name)
    full = await replay_events([history])
    kinds = [ev.event_type for ev in history.events]
    starts = [i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED]
    for n, started in enumerate(starts):
        how = (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED
            if n % 2 == 0
            else EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT
        )
        closed = _closed_during(history, started, how)
        assert len(emitted(closed).events) == started + 1
        before = await replay_events([WorkflowHistory(history.workflow_id, closed.events[:-2])])
        got = await replay_events([closed])
        # what the task emitted in the recorded run: the events up to the next task's start
        upto = starts[n + 1] if n + 1 < len(starts) else len(kinds)
        after = await replay_events([WorkflowHistory(history.workflow_id, history.events[:upto])])
        assert got == full[: len(got)], f"task started at event {started + 1}"
        assert len(before) <= len(got) <= len(after)
        if whole_task:
            assert got == after, f"task started at event {started + 1}"
    # closed while no task ran (the last one completed; the next one, if scheduled, never
    # started): the committed tasks' events, as before
    for i, k in enumerate(kinds):
        if k != EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            continue
        cut = WorkflowHistory(history.workflow_id, history.events[: i + 1])
        terminated = HistoryEvent(
            event_id=history.events[i].event_id + 1,
            event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        )
        ended = WorkflowHistory(history.workflow_id, [*cut.events, terminated])
        assert emitted(ended).events == committed(cut).events


async def test_events_survive_a_replay_that_pauses_for_seconds(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``engine.events`` rebuilds the stream by replaying the run's history; a replay that
    pauses for more than 2 s (a full garbage collection beside a CPU hog, seen on a clean
    clone) still reads the events. Before: temporalio's deadlock detector failed the replay
    and ``events`` raised "does not replay on this driver's code"."""
    import time as _time

    from temporalio import workflow

    from driver_temporal._workflow import GraphWorkflow

    wf = Workflow(f"hist-pause-{_time.monotonic_ns()}", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return ctx.input.n

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    real = GraphWorkflow._record_end

    def paused(self: GraphWorkflow, state: dict[str, Any]) -> None:
        if workflow.unsafe.is_replaying():
            _time.sleep(2.5)  # (the replay's thread stalls, as in a long GC pause)
        real(self, state)

    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            await engine.wait(run.id, timeout=60)
        monkeypatch.setattr(GraphWorkflow, "_record_end", paused)
        events = await engine.events(run.id)
    assert [e.type for e in events][-1] == "run.completed", events
    assert [e.id for e in events] == [e.id for e in sink.for_run(run.id)]
