"""``local=True`` stages run as Temporal local activities: the history records a marker, not an
``ActivityTaskScheduled``, and the observable results (output, steps, events, compensation) are
those of the same graph run with regular activities."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from engine_port import MemorySink, Registry, Retry, StageContext, Workflow

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0
    fail: bool = False


def graph(wf_id: str, local: bool, counts: dict[str, int]) -> Workflow[In]:
    wf = Workflow(wf_id, input=In)

    def bump(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return ctx.input.n + 1

    @wf.stage(
        after=[a],
        local=local,
        retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)),
    )
    async def b(ctx: StageContext[In]) -> int:
        def x() -> int:
            bump("x")
            return 10

        vx = await ctx.step.run("x", x)
        ctx.emit("b.done", {"x": vx})
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return int(ctx.output_of("a")) + int(vx)

    @b.compensation
    async def undo_b(ctx: StageContext[In], out: int) -> None:
        bump("undo_b")

    # (its three tries a few ms apart: the default backoff of 1 s, then 2 s, cost each run
    # of the "compensates" case 3 s)
    @wf.stage(after=[b], retry=Retry(initial_interval=timedelta(milliseconds=50)))
    async def c(ctx: StageContext[In]) -> int:
        if ctx.input.fail:
            raise ValueError("c refuses")
        return int(ctx.output_of("b")) * 2

    return wf


async def _history_types(address: str, run_id: str) -> list[tuple[str, str]]:
    client = await Client.connect(address)
    history = await client.get_workflow_handle(run_id).fetch_history()
    out = []
    for ev in history.events:
        name = EventType.Name(ev.event_type)
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            out.append((name, ev.activity_task_scheduled_event_attributes.activity_type.name))
        elif ev.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            out.append((name, ev.marker_recorded_event_attributes.marker_name))
    return out


def _shape(info: Any) -> dict[str, Any]:
    return {
        "status": info.status,
        "output": info.output,
        "error": None if info.error is None else (info.error.type, info.error.message),
        "stages": [(s.id, s.status, s.attempt, s.output) for s in info.stages],
    }


@pytest.mark.parametrize("fail", [False, True], ids=["completes", "compensates"])
async def test_local_stage_runs_as_local_activity_with_the_same_results(
    make_engine: EngineFactory, temporal_address: str, fail: bool
) -> None:
    results = {}
    for local in (False, True):
        counts: dict[str, int] = {}
        wf_id = "loc-l" if local else "loc-r"
        sink = MemorySink()
        engine = make_engine(Registry([graph(wf_id, local, counts)]), sink=sink)
        async with engine, engine.worker():
            run = await engine.start(wf_id, {"n": 1, "fail": fail})
            info = await engine.wait(run.id, timeout=30)
        events = sink.for_run(run.id)
        results[local] = (
            _shape(info),
            trace(sink, run),
            [(e.type, e.stage, e.data) for e in events if e.business],
            counts,
        )
        history = await _history_types(temporal_address, run.id)
        scheduled = [t for kind, t in history if kind == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]
        markers = [t for kind, t in history if kind == "EVENT_TYPE_MARKER_RECORDED"]
        if local:
            assert "b" not in scheduled and "b.compensate" not in scheduled, history
            assert "a" in scheduled and "c" in scheduled
            # two attempts of b (+ its compensation) were markers, next to any event publishes
            # (the run's end is recorded by its worker, no local activity: ``_run_end``)
            assert markers.count("core_local_activity") >= (3 if fail else 2), history
        else:
            assert scheduled.count("b") == 2 and ("b.compensate" in scheduled) == fail
    assert results[True] == results[False]
    shape, _, business, counts = results[True]
    assert counts["x"] == 1  # the journaled step replays in attempt 2
    if fail:
        assert shape["status"] == "failed" and counts["undo_b"] == 1 and business == []
    else:
        assert shape["status"] == "completed" and shape["output"] == 24
        assert business == [("b.done", "b", {"x": 10})]
