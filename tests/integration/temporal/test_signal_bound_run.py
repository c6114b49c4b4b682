"""The bound on queued signals (``max_pending_signals``) is the run's own, the one the engine
that started it had: SignalQueueFullError names it even when the sending engine is configured
with another."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, Registry, StageContext, Workflow
from engine_port.errors import SignalQueueFullError

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    pass


def _waiter(wid: str) -> Workflow[In]:
    wf = Workflow(wid, input=In)

    @wf.stage(signals=["go", "x"])
    async def w(ctx: StageContext[In]) -> list[object]:
        await ctx.step.wait_for_signal("go")
        return [await ctx.step.wait_for_signal("x") for _ in range(3)]

    return wf


async def test_the_refusal_names_the_runs_bound(make_engine: EngineFactory) -> None:
    wf = _waiter("bound-of-the-run")
    sink = MemorySink()
    starter = make_engine(Registry([wf]), sink=sink, max_pending_signals=2)
    sender = make_engine(Registry([wf]), max_pending_signals=50)
    async with starter, starter.worker(), sender:
        run = await starter.start(wf.id, {})
        await wait_for_event(sink, run.id, "stage.suspended")
        for i in range(2):
            await sender.signal(run.id, "x", i)
        with pytest.raises(SignalQueueFullError) as caught:
            await sender.signal(run.id, "x", 2)
        assert caught.value.limit == 2
        assert "already holds 2 signals" in str(caught.value)
        assert "max_pending_signals" in str(caught.value)
        await starter.cancel(run.id)
