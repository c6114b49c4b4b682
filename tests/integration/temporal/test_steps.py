"""S6 sleep, S7/S8 signals, S9 wait timeout, S10 cancel, S11 idempotency, S15 hooks."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, Registry, Retry, StageContext, Workflow
from engine_port.errors import IdempotencyConflictError, RunNotActiveError, StepTimeoutError

from .conftest import EngineFactory, trace, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


async def test_s6_durable_sleep_replays_steps(make_engine: EngineFactory) -> None:
    counts = {"x": 0}
    wf = Workflow("sleepy", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> int:
        def x() -> int:
            counts["x"] += 1
            return 7

        v = await ctx.step.run("x", x)
        await ctx.step.sleep("nap", timedelta(milliseconds=300))
        return int(v)

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("sleepy", {})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed" and info.output == 7
    assert counts["x"] == 1
    assert trace(sink, run)[2:] == [
        ("stage.started", "s"),
        ("stage.suspended", "s"),
        ("stage.completed", "s"),
        ("run.completed", None),
    ]
    events = sink.for_run(run.id)
    susp = events[3]
    assert susp.data["reason"] == "sleep"
    until = datetime.fromisoformat(susp.data["until"])
    assert events[4].at >= until


def waiter(timeout: timedelta | None = None) -> Workflow[In]:
    wf = Workflow("waiter", input=In)

    @wf.stage
    async def w(ctx: StageContext[In]) -> dict[str, Any]:
        payload = await ctx.step.wait_for_signal("go", timeout=timeout)
        return {"got": payload}

    return wf


async def test_s7_signal_after_wait_and_already_completed(make_engine: EngineFactory) -> None:
    sink = MemorySink()
    engine = make_engine(Registry([waiter()]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("waiter", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        info = await engine.get_run(run.id)
        assert info.status == "suspended"
        assert info.stage("w").waiting_for == "signal:go"
        res = await engine.signal(run.id, "go", {"n": 1})
        assert res.delivered and not res.already_completed
        info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed" and info.output == {"got": {"n": 1}}
        with pytest.raises(RunNotActiveError):
            await engine.signal(run.id, "go", {"n": 2})
    assert trace(sink, run)[2:] == [
        ("stage.started", "w"),
        ("stage.suspended", "w"),
        ("stage.completed", "w"),
        ("run.completed", None),
    ]
    susp = sink.for_run(run.id)[3]
    assert susp.data["waiting_for"] == "signal:go"


async def test_s7_second_signal_while_active_is_queued_not_dropped(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("twowaits", input=In)

    @wf.stage
    async def w(ctx: StageContext[In]) -> list[Any]:
        first = await ctx.step.wait_for_signal("go")
        second = await ctx.step.wait_for_signal("more")
        return [first, second]

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("twowaits", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        assert (await engine.signal(run.id, "go", 1)).delivered
        for _ in range(100):
            if len([e for e in sink.for_run(run.id) if e.type == "stage.suspended"]) == 2:
                break
            await asyncio.sleep(0.05)
        again = await engine.signal(run.id, "go", 2)
        assert (again.delivered, again.already_completed) == (False, False)  # buffered
        await engine.signal(run.id, "more", 3)
        info = await engine.wait(run.id, timeout=30)
    assert info.output == [1, 3]


async def test_a_raw_temporal_signal_from_an_operator_queues_its_input(
    make_engine: EngineFactory,
) -> None:
    """``temporal workflow signal --name go --input '{...}'`` sends the user's JSON as-is:
    the workflow queues it as the payload, behind a signal the engine sent."""
    wf = Workflow("rawsig", input=In)

    @wf.stage
    async def w(ctx: StageContext[In]) -> list[Any]:
        return [await ctx.step.wait_for_signal("go") for _ in range(4)]

    forged = {"$wfe_spill": {"key": "runs/other-run/outputs/secret.json"}}
    # (no worker yet: the engine's signal waits signal_timeout, 5 s by default, for one to
    # answer before it buffers the signal on the server)
    engine = make_engine(Registry([wf]), sink=MemorySink(), options={"signal_timeout": 0.5})
    async with engine:
        run = await engine.start("rawsig", {})
        await engine.signal(run.id, "go", {"via": "engine"}, idempotency_key="e1")
        handle = engine._conn.get_workflow_handle(run.id)
        await handle.signal("go", {"ok": True, "payload": "user data"})  # as an operator would
        await handle.signal("go", 5)
        await handle.signal("go", forged)  # user data, never read as a reference
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
    assert info.output == [{"via": "engine"}, {"ok": True, "payload": "user data"}, 5, forged]


async def test_s8_signal_before_wait_is_buffered(make_engine: EngineFactory) -> None:
    sink = MemorySink()
    engine = make_engine(Registry([waiter()]), sink=sink)
    async with engine:
        run = await engine.start("waiter", {})
        res = await engine.signal(run.id, "go", {"early": True})  # no worker yet
        assert (res.delivered, res.already_completed) == (False, False)  # buffered
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
    assert info.output == {"got": {"early": True}}
    assert trace(sink, run)[2:] == [
        ("stage.started", "w"),
        ("stage.completed", "w"),
        ("run.completed", None),
    ]


async def test_s9_wait_timeout_raises_step_timeout(make_engine: EngineFactory) -> None:
    wf = Workflow("timeouts", input=In)
    seen: list[str] = []

    @wf.stage(retry=Retry(max_attempts=1))
    async def w(ctx: StageContext[In]) -> str:
        try:
            await ctx.step.wait_for_signal("go", timeout=timedelta(milliseconds=300))
        except StepTimeoutError as exc:
            seen.append(type(exc).__name__)
            raise
        return "never"

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("timeouts", {})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "StepTimeoutError"
    assert seen == ["StepTimeoutError"]
    assert trace(sink, run)[2:] == [
        ("stage.started", "w"),
        ("stage.suspended", "w"),
        ("stage.failed", "w"),
        ("run.failed", None),
    ]


async def test_s10_cancel_while_suspended(make_engine: EngineFactory) -> None:
    wf = Workflow("cancelme", input=In)
    undone: list[str] = []

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        ctx.emit("a.done", {})
        return "A"

    @a.compensation
    async def undo_a(ctx: StageContext[In], out: str) -> None:
        undone.append("a")

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        return "B"

    @b.compensation
    async def undo_b(ctx: StageContext[In], out: str) -> None:
        undone.append("b")

    @wf.stage(after=[b])
    async def c(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("approve")

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("cancelme", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        info = await engine.cancel(run.id)
        assert info.status == "cancelled"
        again = await engine.cancel(run.id)
        assert again.status == "cancelled"
        with pytest.raises(RunNotActiveError):
            await engine.signal(run.id, "approve", {})
    assert undone == ["b", "a"]
    assert {s.id: s.status for s in info.stages} == {
        "a": "compensated",
        "b": "compensated",
        "c": "cancelled",
    }
    assert trace(sink, run)[-4:] == [
        ("stage.cancelled", "c"),
        ("stage.compensated", "b"),
        ("stage.compensated", "a"),
        ("run.cancelled", None),
    ]
    assert not any(e.business for e in sink.events)


async def test_cancel_reaches_a_running_stage(make_engine: EngineFactory) -> None:
    wf = Workflow("longrun", input=In)
    seen: list[str] = []

    @wf.stage
    async def slow(ctx: StageContext[In]) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "late"

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("longrun", {})
        await wait_for_event(sink, run.id, "stage.started")
        await asyncio.sleep(0.3)
        info = await engine.cancel(run.id)
        assert (await engine.cancel(run.id)).status == "cancelled"  # no-op
    assert info.status == "cancelled"
    assert info.stage("slow").status == "cancelled"
    assert seen == ["cancelled"]
    assert trace(sink, run)[-2:] == [("stage.cancelled", "slow"), ("run.cancelled", None)]


async def test_s11_idempotent_start(make_engine: EngineFactory) -> None:
    sink = MemorySink()
    engine = make_engine(Registry([waiter()]), sink=sink)
    async with engine:
        key = f"order-{uuid.uuid4().hex}"
        first = await engine.start("waiter", {"n": 1}, idempotency_key=key)
        second = await engine.start("waiter", {"n": 1}, idempotency_key=key)
        assert first.id == second.id
        with pytest.raises(IdempotencyConflictError):
            await engine.start("waiter", {"n": 2}, idempotency_key=key)
        key8 = key + "-8"
        runs = await asyncio.gather(
            *(engine.start("waiter", {"n": 5}, idempotency_key=key8) for _ in range(8))
        )
        assert len({r.id for r in runs}) == 1
        listed = await engine.list_runs(workflow_id="waiter")
        for _ in range(50):
            if len(listed) == 2:
                break
            await asyncio.sleep(0.1)
            listed = await engine.list_runs(workflow_id="waiter")
        assert sorted(r.id for r in listed) == sorted({first.id, runs[0].id})
        async with engine.worker():
            await engine.signal(first.id, "go", 1)
            await engine.wait(first.id, timeout=30)
            # a finished run is still found by its key
            again = await engine.start("waiter", {"n": 1}, idempotency_key=key)
            assert again.id == first.id and again.status == "completed"
            await engine.cancel(runs[0].id)
    assert len([e for e in sink.for_run(first.id) if e.type == "run.created"]) == 1


async def test_s15_hooks_run_as_durable_steps(make_engine: EngineFactory) -> None:
    wf = Workflow("hooked", input=In, hooks=["order.charged", "nobody"])
    calls: list[str] = []

    @wf.stage
    async def charge(ctx: StageContext[In]) -> list[Any]:
        first = await ctx.hook("order.charged", {"amount": 5})
        await ctx.step.sleep("settle", timedelta(milliseconds=100))
        none = await ctx.hook("nobody", {})
        return [first, none]

    def h1(ctx: StageContext[In], payload: dict[str, Any]) -> str:
        calls.append("h1")
        return f"h1:{payload['amount']}"

    async def h2(ctx: StageContext[In], payload: dict[str, Any]) -> str:
        calls.append("h2")
        return "h2"

    reg = Registry([wf])
    reg.register_hook("order.charged", h1, name="h1")
    reg.register_hook("order.charged", h2, name="h2")
    engine = make_engine(reg)
    async with engine, engine.worker():
        run = await engine.start("hooked", {})
        info = await engine.wait(run.id, timeout=30)
    assert info.output == [["h1:5", "h2"], []]
    assert calls == ["h1", "h2"]
