"""Stage timeout (per attempt, retried by the stage policy) and run timeout."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, Registry, Retry, StageContext, Workflow

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


async def test_stage_timeout_fails_the_attempt_and_retries(make_engine: EngineFactory) -> None:
    wf = Workflow("stagetimeout", input=In)

    @wf.stage(
        timeout=timedelta(milliseconds=300),
        retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)),
    )
    async def slow(ctx: StageContext[In]) -> int:
        if ctx.attempt == 1:
            await asyncio.sleep(5)
        return ctx.attempt

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("stagetimeout", {})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed" and info.output == 2
    failed = next(e for e in sink.for_run(run.id) if e.type == "stage.failed")
    assert failed.data["error"]["type"] == "StageTimeoutError"
    assert failed.data["will_retry"] is True


async def test_run_timeout_fails_and_compensates(make_engine: EngineFactory) -> None:
    wf = Workflow("runtimeout", input=In, timeout=timedelta(milliseconds=800))
    undone: list[str] = []

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        return "A"

    @a.compensation
    async def undo(ctx: StageContext[In], out: str) -> None:
        undone.append(out)

    @wf.stage(after=[a])
    async def forever(ctx: StageContext[In]) -> str:
        await ctx.step.wait_for_signal("never")
        return "x"

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("runtimeout", {})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "RunTimeoutError"
    assert undone == ["A"]
    assert info.stage("forever").status == "cancelled"
    assert trace(sink, run)[-3:] == [
        ("stage.cancelled", "forever"),
        ("stage.compensated", "a"),
        ("run.failed", None),
    ]
