"""``TemporalEngine.events(run_id)``: the run's event stream rebuilt from its workflow
histories equals what the EventSink received (ids, types, order, data, times), as the native
driver's ``events`` reads its outbox. Covers events carried by stage activities, those of the
``wfe.publish`` / ``wfe.save_state`` local activities (not stored in the history: a local
activity's marker keeps its result only), a ``local=True`` stage, and a redrive (a second
execution of the same workflow id)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, Registry, Retry, StageContext, Workflow
from engine_port.errors import RunNotFoundError

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal


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
