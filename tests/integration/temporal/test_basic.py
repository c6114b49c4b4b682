"""S1, S2: linear and parallel graphs on a real Temporal dev server."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, Registry, StageContext, Workflow

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int


def linear() -> tuple[Workflow[In], dict[str, int]]:
    counts = {"a": 0, "b": 0, "c": 0}
    wf = Workflow("linear", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        counts["a"] += 1
        return ctx.input.n + 1

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        counts["b"] += 1
        return int(ctx.output_of("a")) * 2

    @wf.stage(after=[b])
    async def c(ctx: StageContext[In]) -> dict[str, Any]:
        counts["c"] += 1
        return {"result": ctx.output_of("b")}

    return wf, counts


async def test_s1_linear(make_engine: EngineFactory) -> None:
    wf, counts = linear()
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine:
        run = await engine.start("linear", {"n": 1})
        assert run.status == "pending"
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed", info
    assert info.output == {"result": 4}
    assert [s.status for s in info.stages] == ["completed"] * 3
    assert counts == {"a": 1, "b": 1, "c": 1}
    assert trace(sink, run) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("stage.completed", "a"),
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("stage.started", "c"),
        ("stage.completed", "c"),
        ("run.completed", None),
    ]


async def test_s2_parallel_group(make_engine: EngineFactory) -> None:
    wf = Workflow("diamond", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return ctx.input.n

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        return int(ctx.output_of("a")) + 10

    @wf.stage(after=[a])
    async def c(ctx: StageContext[In]) -> int:
        return int(ctx.output_of("a")) + 100

    @wf.stage(after=[b, c])
    async def d(ctx: StageContext[In]) -> list[int]:
        return [ctx.output_of("b"), ctx.output_of("c")]

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("diamond", {"n": 1})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed"
    assert info.output == [11, 101]
    events = trace(sink, run)
    group = events[4:8]
    assert sorted(group, key=lambda e: (e[1], e[0] != "stage.started")) == [
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("stage.started", "c"),
        ("stage.completed", "c"),
    ]
    assert events[:4] == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("stage.completed", "a"),
    ]
    assert events[8:] == [
        ("stage.started", "d"),
        ("stage.completed", "d"),
        ("run.completed", None),
    ]
