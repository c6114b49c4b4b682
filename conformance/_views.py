"""Scenarios: what ``get_run`` says between the events (DESIGN §5: a run reads the same on every
driver at every point, not only at its end).

A stage waiting for a signal, a sleep or a poll is ``suspended`` with what it waits for and
when it gives up; once cancelled it waits for nothing (no ``waiting_for``, no ``wake_at``). A
stage between a failed attempt and its retry is ``pending`` with the failed attempt's number
and error, not finished; cancelled there, it keeps that error. Found by comparing snapshots of
both drivers field by field (the traces alone were equal).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from engine_port import MemorySink, Registry, Retry, RunInfo, RunStatus, StageContext, Workflow

from ._harness import CONTRACT_MARKS, Harness, unique_id, wait_for_events
from ._models import Num

__all__ = ["RunViewContract"]


def _waits(info: RunInfo, stage: str, waiting_for: str) -> None:
    st = info.stage(stage)
    assert info.status == RunStatus.SUSPENDED, info.status
    assert (st.status, st.attempt, st.waiting_for) == ("suspended", 1, waiting_for)
    assert st.wake_at is not None and st.finished_at is None


def _cancelled(info: RunInfo, stage: str) -> None:
    st = info.stage(stage)
    assert info.status == RunStatus.CANCELLED, info.status
    assert (st.status, st.waiting_for, st.wake_at) == ("cancelled", None, None)
    assert st.finished_at is not None


class RunViewContract:
    """``get_run`` between the events reads the same on every driver."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_a_waiting_stage_says_what_it_waits_for_until_cancelled(
        self, harness: Harness
    ) -> None:
        signal = Workflow(unique_id("v-sig"), input=Num)

        @signal.stage
        async def first(ctx: StageContext[Num]) -> str:
            return "x"

        @signal.stage(after=[first])
        async def wait(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("go", timeout=120)

        sleep = Workflow(unique_id("v-nap"), input=Num)

        @sleep.stage
        async def nap(ctx: StageContext[Num]) -> str:
            await ctx.step.sleep("nap", 120)
            return "up"

        poll = Workflow(unique_id("v-poll"), input=Num)

        @poll.stage
        async def pol(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for("ready", lambda: None, interval=60, timeout=120)

        sink = MemorySink()
        registry = Registry([signal, sleep, poll])
        async with harness.engine(registry, sink) as engine, engine.worker():
            runs = {
                "wait": await engine.start(signal.id, {"n": 1}),
                "nap": await engine.start(sleep.id, {"n": 2}),
                "pol": await engine.start(poll.id, {"n": 3}),
            }
            for run in runs.values():
                await wait_for_events(sink, run.id, "stage.suspended")
            waiting = await engine.get_run(runs["wait"].id)
            _waits(waiting, "wait", "signal:go")
            assert waiting.stage("first").status == "completed"
            assert waiting.stage("first").output == "x"
            _waits(await engine.get_run(runs["nap"].id), "nap", "sleep:nap")
            _waits(await engine.get_run(runs["pol"].id), "pol", "poll:ready")
            for stage, run in runs.items():
                await engine.cancel(run.id)
                _cancelled(await engine.wait(run.id, timeout=60), stage)
                _cancelled(await engine.get_run(run.id), stage)

    async def test_a_stage_between_attempts_is_pending_with_its_error(
        self, harness: Harness
    ) -> None:
        wf = Workflow(unique_id("v-retry"), input=Num)

        @wf.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=120)))
        async def flaky(ctx: StageContext[Num]) -> str:
            raise ValueError("flaky")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 1})
            await wait_for_events(sink, run.id, "stage.failed")
            info = await engine.get_run(run.id)
            st = info.stage("flaky")
            assert info.status == RunStatus.RUNNING, info.status
            assert (st.status, st.attempt, st.finished_at) == ("pending", 1, None)
            assert st.error is not None and st.error.type == "ValueError"
            assert st.started_at is not None
            await engine.cancel(run.id)
            done = await engine.wait(run.id, timeout=60)
        st = done.stage("flaky")
        assert done.status == RunStatus.CANCELLED
        assert (st.status, st.attempt) == ("cancelled", 1)
        assert st.error is not None and st.error.type == "ValueError"
