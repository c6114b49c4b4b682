"""The run's times do not depend on how sdk-core split the workflow task of a local activity
(``driver_temporal._clock``): ``engine.events`` (the run's events rebuilt by replaying its
histories) equals what the EventSink received, times included, and the replayed state's stage
times equal the memo's, when a query came with the task that runs a ``local=True`` stage.

sdk-core answers such a query by completing the task at once and having Temporal start a new
one, and the workflow hears the local activity's result in that new task:

- ``reported``: the local stage had reported when the query was answered: its marker is
  recorded by the first task, and a replay hands the result over there, at the marker's time,
  where the live run heard it at the new task's started time;
- ``running``: it still ran: the first task completed with no command, and a replay takes it
  for a heartbeat of the new one and runs its activation at the new task's started time, where
  the live run ran it at its own (the events before the local stage's result too).

On runs started before the ``clock`` mark the events differed by those milliseconds (CI:
``test_history_events.test_events_span_a_redrive`` on a loaded host, ``engine.signal``'s query
coming with the local stage's task), here every time. ``histories/local_clock_*.json`` were
recorded with ``histories/record_local_clock.py``: a run split each way and the events its sink
received.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from driver_temporal._history_events import replay_events, replay_info
from driver_temporal._names import RUN_INFO_QUERY
from engine_port import Event, MemorySink, Registry, StageContext, Workflow

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal
HISTORIES = Path(__file__).parent / "histories"
SHAPES = ["reported", "running"]


class In(BaseModel):
    n: int


def query_flow(shape: str) -> Workflow[In]:
    """``reported``: a no-op local stage beside a regular one (the task issues a command, the
    activity's schedule); ``running``: a local stage of a second alone (no command). A stage
    after them."""
    wf = Workflow(f"local-clock-{shape}", input=In)

    @wf.stage(local=True)
    async def quick(ctx: StageContext[In]) -> str:
        if shape == "running":
            await asyncio.sleep(1.0)
        ctx.emit("quick.noted", {"n": ctx.input.n})
        return "noted"

    after = [quick]
    if shape == "reported":

        @wf.stage()
        async def remote(ctx: StageContext[In]) -> int:
            return ctx.input.n

        after.append(remote)

    @wf.stage(after=after)
    async def last(ctx: StageContext[In]) -> str:
        return "done"

    return wf


def split_task(history: WorkflowHistory) -> str | None:
    """How the query split the run's first workflow task (the one that runs the local stage):
    completed at once, its commands (a marker if the local activity had reported) followed
    directly by the next task's scheduling, with no event that would have scheduled it:
    ``reported`` or ``running``; None: not split."""
    events = list(history.events)
    done = next(
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    task = events[done].event_id
    end = done + 1
    while end < len(events) and _command_of(events[end], task):
        end += 1
    if end == len(events) or (
        events[end].event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    ):
        return None
    markers = [e for e in events[done:end] if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    return "reported" if markers else "running"


def _command_of(event: HistoryEvent, task: int) -> bool:
    kind = event.WhichOneof("attributes")
    attrs = getattr(event, kind) if kind else None
    return getattr(attrs, "workflow_task_completed_event_id", None) == task


def stage_times(info: Any) -> dict[str, tuple[datetime | None, ...]]:
    """(started_at, finished_at) per stage of a ``wfe_run`` memo."""
    return {
        s["id"]: tuple(None if s.get(k) is None else datetime.fromisoformat(s[k]) for k in _AT)
        for s in info["stages"]
    }


_AT = ("started_at", "finished_at")


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_query_with_the_local_stage_task_changes_no_time(
    make_engine: EngineFactory, shape: str
) -> None:
    sink = MemorySink()
    wf = query_flow(shape)
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine:
        run = await engine.start(wf.id, {"n": 3})
        handle = engine._conn.get_workflow_handle(run.id)
        # asked while no worker runs: the server hands the query over with the run's first
        # task, the one that runs the local stage
        asked = asyncio.ensure_future(handle.query(RUN_INFO_QUERY))
        await asyncio.sleep(1.0)
        async with engine.worker():
            await asyncio.wait_for(asked, 30)
            done = await engine.wait(run.id, timeout=30)
            assert done.status == "completed", done
            await wait_for_event(sink, run.id, "run.completed")
        events = await engine.events(run.id)
        history = await handle.fetch_history()
        final = await (await handle.describe()).memo()
    # the query did split the task (mostly each shape its own way: a no-op local stage has
    # reported when the query is answered, one of a second has not)
    assert split_task(history) is not None
    received = sink.for_run(run.id)
    assert [(e.type, e.stage) for e in events] == [(e.type, e.stage) for e in received]
    assert events == received  # the times too
    # the stage times of the replayed state are those of the live run's last memo, and the
    # events'
    replayed = await replay_info(history)
    assert replayed is not None
    assert stage_times(replayed) == stage_times(final["wfe_run"])
    times = stage_times(final["wfe_run"])
    for e in received:
        if e.type == "stage.started":
            assert times[str(e.stage)][0] == e.at
        if e.type == "stage.completed":
            assert times[str(e.stage)][1] == e.at


def _recorded(shape: str) -> tuple[WorkflowHistory, list[Event]]:
    data = json.loads((HISTORIES / f"local_clock_{shape}.json").read_text())
    history = WorkflowHistory.from_json(data["workflow_id"], data["history"])
    return history, [Event.model_validate(e) for e in data["events"]]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_recorded_split_task_replays_the_times_the_sink_received(shape: str) -> None:
    """No server: the recorded run's first task was split by the query, and the replay gives
    every event the time the sink received."""
    history, received = _recorded(shape)
    assert split_task(history) == shape
    events = await replay_events([history])
    assert [e.id for e in events] == [e.id for e in received]
    assert events == received
