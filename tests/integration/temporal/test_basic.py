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
