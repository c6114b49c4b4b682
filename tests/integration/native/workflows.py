"""Workflows for the native driver's integration tests. Stage bodies count their executions
in ``COUNTS`` (outside the engine) and can be held with ``BLOCK`` to simulate long stages."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from engine_port import NonRetryableError, Retry, StageContext, Workflow

COUNTS: Counter[str] = Counter()
BLOCK: dict[str, bool] = {}
STARTED: dict[str, asyncio.Event] = {}


def reset() -> None:
    COUNTS.clear()
    BLOCK.clear()
    STARTED.clear()


def started(name: str) -> asyncio.Event:
    return STARTED.setdefault(name, asyncio.Event())


class Item(BaseModel):
    n: int = 1
    note: str = ""


# -- linear a -> b -> c ----------------------------------------------------------------------
linear = Workflow("it-linear", input=Item)


@linear.stage
async def a(ctx: StageContext[Item]) -> int:
    COUNTS["a"] += 1
    return ctx.input.n + 1


@linear.stage(after=[a])
async def b(ctx: StageContext[Item]) -> int:
    COUNTS["b"] += 1
    return int(ctx.output_of(a)) * 2


@linear.stage(after=[b])
async def c(ctx: StageContext[Item]) -> dict[str, Any]:
    COUNTS["c"] += 1
    ctx.emit("it.done", {"n": ctx.input.n})
    return {"result": int(ctx.output_of(b)) + 1}


# -- a stage that can be held (leases, heartbeats, shutdown) ----------------------------------
held = Workflow("it-held", input=Item)


@held.stage
async def slow(ctx: StageContext[Item]) -> str:
    COUNTS["slow"] += 1
    started("slow").set()
    if BLOCK.get("slow"):
        await asyncio.sleep(3600)
    if BLOCK.get("slow_for"):
        await asyncio.sleep(float(ctx.input.n) / 10)  # a long stage, n tenths of a second
    return "done"


@held.stage(after=[slow])
async def after_slow(ctx: StageContext[Item]) -> str:
    COUNTS["after_slow"] += 1
    return str(ctx.output_of(slow)) + "!"


# -- durable sleep (short or long, by input) ---------------------------------------------------
napper = Workflow("it-napper", input=Item)


@napper.stage
async def nap(ctx: StageContext[Item]) -> int:
    COUNTS["nap"] += 1
    await ctx.step.sleep("nap", timedelta(milliseconds=ctx.input.n))
    return ctx.input.n


# -- waits for a signal; compensable upstream ----------------------------------------------------
waiter = Workflow("it-waiter", input=Item)


@waiter.stage
async def prep(ctx: StageContext[Item]) -> str:
    COUNTS["prep"] += 1
    return "prepped"


@prep.compensation
async def unprep(ctx: StageContext[Item], output: str) -> None:
    COUNTS["unprep"] += 1


@waiter.stage(after=[prep])
async def wait_go(ctx: StageContext[Item]) -> dict[str, Any]:
    COUNTS["wait_go"] += 1
    payload = await ctx.step.wait_for_signal("go")
    return {"got": payload}


# -- retries then failure -------------------------------------------------------------------------
flaky = Workflow("it-flaky", input=Item)


@flaky.stage
async def first(ctx: StageContext[Item]) -> str:
    COUNTS["first"] += 1
    return "ok"


@first.compensation
async def undo_first(ctx: StageContext[Item], output: str) -> None:
    COUNTS["undo_first"] += 1


@flaky.stage(
    after=[first],
    retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=1000), backoff=1.0),
)
async def boom(ctx: StageContext[Item]) -> str:
    COUNTS["boom"] += 1
    if ctx.input.note == "fatal":
        raise NonRetryableError("boom is fatal")
    raise RuntimeError(f"boom attempt {ctx.attempt}")


# -- run timeout ----------------------------------------------------------------------------------
timed = Workflow("it-timed", input=Item, timeout=timedelta(seconds=3))


@timed.stage
async def reserve(ctx: StageContext[Item]) -> str:
    COUNTS["reserve"] += 1
    return "reserved"


@reserve.compensation
async def release(ctx: StageContext[Item], output: str) -> None:
    COUNTS["release"] += 1


@timed.stage(after=[reserve])
async def dawdle(ctx: StageContext[Item]) -> str:
    COUNTS["dawdle"] += 1
    await ctx.step.sleep("long", timedelta(seconds=30))
    return "late"


# -- a large output (claim check) -------------------------------------------------------------
big = Workflow("it-big", input=Item)


@big.stage
async def large(ctx: StageContext[Item]) -> str:
    COUNTS["large"] += 1
    step = await ctx.step.run("blob", lambda: "y" * (100 * 1024))
    return "x" * (ctx.input.n * 1024) + step[:1]


ALL = [linear, held, napper, waiter, flaky, timed, big]
