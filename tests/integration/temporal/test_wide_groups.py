"""A parallel group wider than ``temporal_max_stage_activities`` runs with at most that many
stage activities in flight (Temporal refuses a workflow more than 2,000 pending activities by
default, and each workflow task costs the server more the more it holds: a 1 -> 2,000 fan-out
never finished); the rest wait their turn as pending stages, and a stage suspended on a signal
holds no slot."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from engine_port import MemorySink, NonRetryableError, Registry, StageContext, Workflow

from .conftest import EngineFactory, trace, wait_for_event

pytestmark = pytest.mark.temporal

WIDTH = 12
BOUND = 4


class In(BaseModel):
    pass


class Live:
    """How many stage bodies run at once, and the most that ever did."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def hold(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.2)
        finally:
            self.now -= 1


def wide(live: Live) -> Workflow[In]:
    wf = Workflow(f"wide-{uuid.uuid4().hex[:8]}", input=In)

    @wf.stage
    async def root(ctx: StageContext[In]) -> int:
        return 1

    middles = []
    for i in range(WIDTH):

        async def middle(ctx: StageContext[In]) -> int:
            if ctx.stage_id == "m0":
                return int(await ctx.step.wait_for_signal("go"))
            await live.hold()
            return int(ctx.output_of("root")) + int(ctx.stage_id[1:])

        middle.__name__ = f"m{i}"
        middles.append(wf.stage(id=f"m{i}", after=[root])(middle))

    @wf.stage(after=middles)
    async def join(ctx: StageContext[In]) -> int:
        return sum(int(ctx.output_of(m)) for m in middles)

    return wf


def _most_pending(events: list[object]) -> int:
    """The most stage activities scheduled and not yet ended, over the history."""
    ended = {
        EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
        EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
    }
    pending = most = 0
    for ev in events:
        kind = ev.event_type  # type: ignore[attr-defined]
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            pending += 1
            most = max(most, pending)
        elif kind in ended:
            pending -= 1
    return most


async def test_a_group_wider_than_the_bound_runs_a_bounded_number_of_activities_at_once(
    make_engine: EngineFactory,
) -> None:
    live = Live()
    wf = wide(live)
    engine = make_engine(Registry([wf]), temporal_max_stage_activities=BOUND)
    async with engine.worker():
        run = await engine.start(wf.id, {})

        async def others_done() -> bool:
            info = await engine.get_run(run.id)
            return sum(s.status == "completed" for s in info.stages) == WIDTH  # root + 11

        deadline = asyncio.get_running_loop().time() + 60
        while not await others_done():  # m0 waits for its signal holding no slot
            assert asyncio.get_running_loop().time() < deadline, await engine.get_run(run.id)
            await asyncio.sleep(0.1)
        assert (await engine.get_run(run.id)).stage("m0").status == "suspended"
        await engine.signal(run.id, "go", 100)
        info = await engine.wait(run.id, timeout=60)
    assert info.status == "completed", info.error
    assert info.output == 100 + sum(1 + i for i in range(1, WIDTH))
    assert 1 < live.most <= BOUND, live.most
    history = await engine._conn.get_workflow_handle(run.id).fetch_history()
    assert _most_pending(list(history.events)) <= BOUND


async def test_a_stage_failing_stops_the_stages_still_waiting_for_a_slot(
    make_engine: EngineFactory,
) -> None:
    # (as a native run's queued jobs: they never start, no event, skipped when the run ends;
    # the slot m0 freed must not start m2 before the stop)
    wf = Workflow(f"wide-fail-{uuid.uuid4().hex[:8]}", input=In)
    started: list[str] = []
    for i in range(6):

        async def body(ctx: StageContext[In]) -> int:
            started.append(ctx.stage_id)
            if ctx.stage_id == "m0":
                raise NonRetryableError("m0 refuses")
            await asyncio.sleep(0.3)
            return 1

        body.__name__ = f"m{i}"
        wf.stage(id=f"m{i}")(body)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, temporal_max_stage_activities=2)
    async with engine.worker():
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=60)
        await wait_for_event(sink, run.id, "run.failed")
    assert info.status == "failed" and info.error is not None
    assert info.error.message == "m0 refuses"
    assert sorted(started) == ["m0", "m1"]
    assert [s.status for s in info.stages[2:]] == ["skipped"] * 4, info.stages
    assert sorted(st for kind, st in trace(sink, run.id) if kind == "stage.started") == ["m0", "m1"]
    assert info.stage("m1").status in ("cancelled", "completed")
