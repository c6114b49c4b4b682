"""Continue-as-new at Temporal's own limits: a run whose queued signals are more than a
continue-as-new can carry in one payload (2 MiB) still goes on in a new execution, and one
stage attempt takes more signals than Temporal lets one execution receive updates (2,000 on
the server's defaults) by suspending and continuing as new in between."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import Registry, StageContext, Workflow

from .conftest import EngineFactory
from .test_continue_as_new import continued

pytestmark = pytest.mark.temporal

NOISE = 2_100  # signals of 1 KB queued: ~2.2 MB, over Temporal's 2 MiB payload limit


class In(BaseModel):
    n: int = 0


async def _send(engine: Any, run_id: str, name: str, count: int, first: int = 0) -> None:
    """``count`` signals ``name`` of ~1 KB, numbered from ``first``; the first two one after
    the other (the stage checks their order), the rest a few at a time."""
    gate = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with gate:
            await engine.signal(run_id, name, {"i": i, "pad": "x" * 1_000})

    for i in range(first, first + 2):
        await one(i)
    await asyncio.gather(*(one(i) for i in range(first + 2, first + count)))


async def test_continue_carries_more_than_a_payload_of_queued_signals(
    make_engine: EngineFactory,
) -> None:
    """2,100 signals of 1 KB queued while a stage waits for another one: once the run was at
    a safe point past ``continue_as_new_events``, each workflow task tried to continue as new
    carrying ~2.2 MB of them and failed (``PayloadsTooLarge``): the run made no progress,
    for ever if only such signals kept coming. Now the queued values past the carry budget go
    to the BlobStore behind references: the run continues, and the stage takes them intact."""
    released = asyncio.Event()
    wf = Workflow(f"can-carry-{uuid.uuid4().hex[:6]}", input=In)

    @wf.stage(signals=["go", "noise"])
    async def s(ctx: StageContext[In]) -> dict[str, Any]:
        async def hold() -> int:
            # the stage's activity is in flight (no safe point) while the noise queues
            await asyncio.wait_for(released.wait(), 300)
            return 1

        await ctx.step.run("hold", hold)
        go = await ctx.step.wait_for_signal("go", timeout=600)
        first = await ctx.step.wait_for_signal("noise", timeout=600)
        second = await ctx.step.wait_for_signal("noise", timeout=600)
        return {"go": go, "noise": [first["i"], len(first["pad"]), second["i"]]}

    engine = make_engine(
        Registry([wf]),
        max_pending_signals=NOISE + 100,
        options={"continue_as_new_events": 200},
    )
    async with engine.worker():
        run = await engine.start(wf.id, {})
        await _send(engine, run.id, "noise", NOISE)
        released.set()
        # the run continues as new (each of its workflow tasks failed to, for ever)
        await continued(engine, run.id)
        await engine.signal(run.id, "go", "ok")
        info = await engine.wait(run.id, timeout=120)
        assert info.status == "completed", info.error
        assert info.output == {"go": "ok", "noise": [0, 1_000, 1]}
