"""The benchmark workflows, written once in the engine_port graph format (both drivers)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from engine_port import Registry, StageContext, Workflow

__all__ = ["STAMPS", "BenchIn", "registry"]

# wall-clock time at which each long-stage step body ran (read in the measuring process)
STAMPS: list[float] = []


class BenchIn(BaseModel):
    n: int = 0


async def tick(i: int) -> int:
    STAMPS.append(time.perf_counter())
    return i


def _seq3(wf_id: str, local: bool) -> Workflow[BenchIn]:
    wf = Workflow(wf_id, input=BenchIn)

    @wf.stage(local=local)
    async def a(ctx: StageContext[BenchIn]) -> int:
        return 1

    @wf.stage(after=[a], local=local)
    async def b(ctx: StageContext[BenchIn]) -> int:
        return 2

    @wf.stage(after=[b], local=local)
    async def c(ctx: StageContext[BenchIn]) -> int:
        return 3

    return wf


def _fanout(width: int) -> Workflow[BenchIn]:
    wf = Workflow(f"bench-fanout-{width}", input=BenchIn)

    @wf.stage
    async def head(ctx: StageContext[BenchIn]) -> int:
        return 0

    async def leaf(ctx: StageContext[BenchIn]) -> int:
        return 1

    leaves = [wf.stage(leaf, id=f"f{i:02d}", after=[head]) for i in range(width)]

    @wf.stage(after=leaves)
    async def join(ctx: StageContext[BenchIn]) -> int:
        return len(ctx.outputs)

    return wf


def _long() -> Workflow[BenchIn]:
    wf = Workflow("bench-long", input=BenchIn)

    @wf.stage
    async def long(ctx: StageContext[BenchIn]) -> int:
        total = 0
        for i in range(ctx.input.n):
            total += await ctx.step.run(f"s{i}", tick, i)
        return total

    return wf


def _signal() -> Workflow[BenchIn]:
    """A stage that starts on ``go`` and returns its payload: what a temporalio user writes
    as ``wait_condition`` then an activity given the payload (``_temporal_raw``)."""
    wf = Workflow("bench-signal", input=BenchIn)

    @wf.stage(after_signal="go")
    async def wait(ctx: StageContext[BenchIn]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


def _signal_in_body() -> Workflow[BenchIn]:
    """The same wait inside the stage body (``python -m bench.tools.temporal_history
    --signal-body``): on Temporal the stage's activity runs until the wait, then again
    once the signal came."""
    wf = Workflow("bench-signal-body", input=BenchIn)

    @wf.stage
    async def wait(ctx: StageContext[BenchIn]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return wf


def registry() -> Registry:
    """Every benchmark workflow (``WFE_APP=bench._workflows:registry`` for worker
    processes)."""
    return Registry(
        [
            _seq3("bench-seq3", local=False),
            _seq3("bench-seq3-local", local=True),
            _fanout(50),
            _fanout(5),
            _long(),
            _signal(),
            _signal_in_body(),
        ]
    )
