"""A stage that waits for a signal several times with a timeout, as a regular activity and
as ``local=True``: each wait takes its own signal, none is lost. A timed wait is journaled
twice (pending with its deadline, then done); a try that reads the journal (every local try,
a retry after a lost worker, a reset) must read only each step's later record: until
2026-12-06 the pending record replaced the done one and the done one then took a second
signal from the try's queue, which the run dropped (the next wait never resumed)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from engine_port import MemorySink, Registry, RunStatus, StageContext, Workflow

from .conftest import EngineFactory
from .test_continue_as_new import In
from .test_reset_signals import wait_number

pytestmark = pytest.mark.temporal

WAITS = 4


def timed_waits(local: bool) -> Workflow[In]:
    wf = Workflow(f"timed-waits-{time.monotonic_ns()}", input=In)

    @wf.stage(signals=["go"], local=local)
    async def s(ctx: StageContext[In]) -> list[Any]:
        return [(await ctx.step.wait_for_signal("go", timeout=600))["v"] for _ in range(WAITS)]

    return wf


@pytest.mark.parametrize("local", [False, True], ids=["activity", "local"])
async def test_each_timed_wait_takes_its_own_signal(
    make_engine: EngineFactory, local: bool
) -> None:
    wf = timed_waits(local)
    engine = make_engine(Registry([wf]), sink=MemorySink())
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            for i in range(WAITS):
                await wait_number(engine, run.id, "go", i)
                await engine.signal(run.id, "go", {"v": i})
            done = await engine.wait(run.id, timeout=60)
    assert done.status == RunStatus.COMPLETED, done
    assert done.output == list(range(WAITS))
