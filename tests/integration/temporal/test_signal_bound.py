"""The Temporal driver bounds the signals a run holds unconsumed like the native driver
(``max_pending_signals``, issue 11): the next one raises SignalQueueFullError and changes
nothing; an idempotent repeat of a queued signal is still answered."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, Registry, StageContext, Workflow
from engine_port.errors import SignalQueueFullError

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    pass


async def test_a_full_signal_queue_refuses_the_next_signal(make_engine: EngineFactory) -> None:
    wf = Workflow("bounded-signals", input=In)

    @wf.stage
    async def w(ctx: StageContext[In]) -> list[object]:
        await ctx.step.wait_for_signal("go")
        return [await ctx.step.wait_for_signal("x") for _ in range(3)]

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, max_pending_signals=3)
    async with engine, engine.worker():
        run = await engine.start("bounded-signals", {})
        await wait_for_event(sink, run.id, "stage.suspended")
        for i in range(3):
            await engine.signal(run.id, "x", i, idempotency_key=f"k{i}")
        with pytest.raises(SignalQueueFullError):
            await engine.signal(run.id, "x", 99)
        again = await engine.signal(run.id, "x", 0, idempotency_key="k0")
        assert again.already_completed
        with pytest.raises(SignalQueueFullError):
            await engine.signal(run.id, "go", None)  # every unconsumed signal counts
        info = await engine.cancel(run.id)
    assert info.status == "cancelled"
