"""Events no stage activity carries (the siblings of a fan-out that end while others run, a
stage that suspends) are handed to the worker running the workflow task (``publish =
"worker"``, ``_outbox._hand_over``), which delivers them, or keeps them in the BlobStore and
retries, before the task completes: no ``wfe.publish`` local activity in the history, and the
sink still gets every event, each first delivery in sequence order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.worker import Replayer

from driver_temporal._run_end import RunEnds
from driver_temporal._workflow import GraphWorkflow, workflow_runner
from engine_port import Event, FolderBlobStore, MemorySink, Registry, StageContext, Workflow

from .conftest import EngineFactory, trace, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


class FirstSeen(MemorySink):
    """Remembers the sequence numbers in the order each event first arrived; fails every
    delivery while ``failing``."""

    def __init__(self) -> None:
        super().__init__()
        self.first: list[int] = []
        self._ids: set[str] = set()

    async def publish(self, events: Sequence[Event]) -> None:
        await super().publish(events)
        for e in events:
            if e.id not in self._ids:
                self._ids.add(e.id)
                self.first.append(e.seq)


def fan_out(width: int) -> Workflow[In]:
    wf = Workflow("handed-fan", input=In)

    @wf.stage
    async def head(ctx: StageContext[In]) -> int:
        return 1

    async def leaf(ctx: StageContext[In]) -> int:
        i = int(ctx.stage_id[1:])
        await asyncio.sleep(0.05 * i)  # they end one after another, each in its own task
        return i

    siblings = [wf.stage(leaf, id=f"f{i}", after=[head]) for i in range(width)]

    @wf.stage(after=siblings)
    async def join(ctx: StageContext[In]) -> str:
        return "joined"

    return wf


async def _markers(engine: object, run_id: str) -> int:
    handle = engine._conn.get_workflow_handle(run_id)  # type: ignore[attr-defined]
    history = await handle.fetch_history()
    return sum(e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED for e in history.events)


async def test_a_fan_outs_events_reach_the_sink_in_order_without_a_local_activity(
    make_engine: EngineFactory,
) -> None:
    sink = FirstSeen()
    engine = make_engine(Registry([fan_out(6)]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("handed-fan", {})
        assert (await engine.wait(run.id, timeout=60)).status == "completed"
        await wait_for_event(sink, run.id, "run.completed")
        assert await _markers(engine, run.id) == 0  # (it ran local activities: 1 per handing)
        replayed = await engine.events(run.id)
    types = trace(sink, run)
    assert sorted(s for t, s in types if t == "stage.completed") == sorted(
        ["head", "join", *[f"f{i}" for i in range(6)]]
    )
    assert sink.first == sorted(sink.first)  # each first delivery after every earlier one
    assert replayed == sink.for_run(run.id)


async def test_a_suspended_stages_event_reaches_the_sink_while_the_run_waits(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("handed-wait", input=In)

    @wf.stage
    async def approve(ctx: StageContext[In]) -> object:
        return await ctx.step.wait_for_signal("approval")

    sink = FirstSeen()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("handed-wait", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        assert await _markers(engine, run.id) == 0
        await engine.signal(run.id, "approval", {"ok": True})
        assert (await engine.wait(run.id, timeout=60)).output == {"ok": True}
        await wait_for_event(sink, run.id, "run.completed")
    assert sink.first == sorted(sink.first)
    types = [t for t, _ in trace(sink, run)]
    assert types.index("stage.suspended") < types.index("stage.completed")


async def test_events_handed_during_a_sink_outage_are_kept_then_delivered_in_order(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    sink = FirstSeen()
    settings = {
        "outbox_retry_initial_seconds": 0.05,
        "outbox_retry_max_seconds": 0.2,
        "dead_letter_after": 1000,
    }
    engine = make_engine(Registry([fan_out(4)]), sink=sink, **settings)
    async with engine, engine.worker():
        sink.failing = True
        run = await engine.start("handed-fan", {})
        assert (await engine.wait(run.id, timeout=60)).status == "completed"
        kept = await FolderBlobStore(blob_dir).list(f"outbox/{run.id}/")
        assert kept, "the undelivered events are not kept"
        assert sink.for_run(run.id) == []
        sink.failing = False
        deadline = time.monotonic() + 30
        while not any(e.type == "run.completed" for e in sink.for_run(run.id)):
            assert time.monotonic() < deadline, "the kept events were never delivered"
            await asyncio.sleep(0.05)
        replayed = await engine.events(run.id)
    assert sink.first == sorted(sink.first)
    assert replayed == sink.for_run(run.id)
    assert len(trace(sink, run)) == len(replayed)


# the worker's store is down, or the worker's event loop too starved to answer in time (a
# TimeoutError, which temporalio would take as the workflow's own failure: the run failed, and
# a later replay, which calls no worker, did not, so a query of it raised a nondeterminism error)
_FAULTS = [OSError("the blob store is down"), TimeoutError()]


@pytest.mark.parametrize("fault", _FAULTS, ids=["store-down", "worker-too-slow"])
@pytest.mark.parametrize("call", ["hand", "record"], ids=["hand-over", "run-end"])
async def test_a_worker_that_fails_a_task_fails_that_task_only_and_loses_no_event(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, fault: Exception, call: str
) -> None:
    """The worker fails once while a task hands events over (``hand``), or while the run's
    last task records its end (``record``): the error fails that workflow task (an error in
    the workflow's publisher task alone failed nothing, and the events it had dropped from the
    outbox were lost), Temporal runs it again, and the sink gets every event; the run completes
    (an infrastructure fault never fails it) and its history replays (a query of the closed
    run) without a nondeterminism error."""
    real = getattr(RunEnds, call)
    calls: list[int] = []

    def failing_once(self: RunEnds, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise fault
        real(self, *args)

    monkeypatch.setattr(RunEnds, call, failing_once)
    sink = FirstSeen()
    engine = make_engine(Registry([fan_out(4)]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("handed-fan", {})
        assert (await engine.wait(run.id, timeout=60)).status == "completed"
        await wait_for_event(sink, run.id, "run.completed")
        replayed = await engine.events(run.id)
        handle = engine._conn.get_workflow_handle(run.id)  # type: ignore[attr-defined]
        history = await handle.fetch_history()
    assert len(calls) >= 2  # done again by the task's next try
    assert history.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    replayer = Replayer(workflows=[GraphWorkflow], workflow_runner=workflow_runner())
    replay = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None
    assert sink.first == sorted(sink.first)
    assert len(trace(sink, run)) == len(replayed)  # (trace: seq 1..n, none missing)
    assert replayed == sink.for_run(run.id)
