"""Scenarios: signal waits inside a parallel group (DESIGN §5 "Signals"; issue 10).

Any number of stage attempts of one group take signals at the same time: each wait for a name
consumes the next buffered signal of that name, each payload exactly once, and a sibling that
is running (or holding the signals it took) never keeps another stage's wait from resuming.

- ``buffered``: two signals ``a`` are buffered before the group {x, y, z} starts; x and y each
  wait for ``a`` and z runs until both completed. x and y consume one payload each without
  suspending, while z still runs.
- ``resume``: in the group {x, y}, x consumes a buffered signal ``c`` and then runs a step that
  lasts until y completed; y suspends on ``b``. Sending ``b`` resumes y at once, before x
  returns.
- ``last busy``: in the group {w, q}, w suspends on ``go`` and q returns only after that: once
  q completed, nothing of the run is busy and the run is ``suspended``; ``go`` resumes w and
  the run completes.

Every barrier is a condition polled with a deadline (the in-process MemorySink, a flag the test
sets), never a sleep that hopes something happened meanwhile. A driver that keeps a sibling
waiting fails at the barrier's deadline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_port import Event, MemorySink, Registry, Retry, RunStatus, StageContext, Workflow

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._models import Num
from ._trace import check_golden, normalise, run_summary

__all__ = ["ParallelSignalContract"]

ONCE = Retry(max_attempts=1)
BARRIER = 60.0  # seconds a body or the test waits for its barrier before it fails the test


def _completed(sink: MemorySink, run_id: str, *stages: str) -> bool:
    done = {e.stage for e in sink.for_run(run_id) if e.type == "stage.completed"}
    return set(stages) <= done


def _seq(events: list[Event], etype: str, stage: str) -> int:
    return next(e.seq for e in events if e.type == etype and e.stage == stage)


def buffered_pair(log: ExecutionLog, sink: MemorySink, opened: dict[str, bool]) -> Workflow[Num]:
    """gate -> {x waits for a, y waits for a, z runs until x and y completed}."""
    wf = Workflow(unique_id("psig-buf"), input=Num)

    @wf.stage(retry=ONCE)
    async def gate(ctx: StageContext[Num]) -> str:
        log.hit("gate")
        await eventually(lambda: opened.get("gate", False), BARRIER, what="the test's signals")
        return "open"

    @wf.stage(after=[gate], retry=ONCE)
    async def x(ctx: StageContext[Num]) -> Any:
        log.hit("x")
        return await ctx.step.wait_for_signal("a")

    @wf.stage(after=[gate], retry=ONCE)
    async def y(ctx: StageContext[Num]) -> Any:
        log.hit("y")
        return await ctx.step.wait_for_signal("a")

    @wf.stage(after=[gate], retry=ONCE)
    async def z(ctx: StageContext[Num]) -> str:
        log.hit("z")
        await eventually(
            lambda: _completed(sink, ctx.run_id, "x", "y"), BARRIER, what="x and y to complete"
        )
        return "z-out"

    return wf


def resume_while_sibling_runs(
    log: ExecutionLog, sink: MemorySink, opened: dict[str, bool]
) -> Workflow[Num]:
    """gate -> {x takes c, then runs a step until y completed; y waits for b}."""
    wf = Workflow(unique_id("psig-run"), input=Num)

    @wf.stage(retry=ONCE)
    async def gate(ctx: StageContext[Num]) -> str:
        log.hit("gate")
        await eventually(lambda: opened.get("gate", False), BARRIER, what="the test's signal")
        return "open"

    @wf.stage(after=[gate], retry=ONCE)
    async def x(ctx: StageContext[Num]) -> Any:
        log.hit("x")
        took = await ctx.step.wait_for_signal("c")

        async def long_step() -> str:
            log.hit("x-step")
            await eventually(
                lambda: _completed(sink, ctx.run_id, "y"), BARRIER, what="y to complete"
            )
            return "y was done"

        return {"took": took, "step": await ctx.step.run("long", long_step)}

    @wf.stage(after=[gate], retry=ONCE)
    async def y(ctx: StageContext[Num]) -> Any:
        log.hit("y")
        return await ctx.step.wait_for_signal("b")

    return wf


def last_busy_sibling(log: ExecutionLog, sink: MemorySink) -> Workflow[Num]:
    """{w waits for go; q returns once w is suspended}."""
    wf = Workflow(unique_id("psig-last"), input=Num)

    @wf.stage(retry=ONCE)
    async def w(ctx: StageContext[Num]) -> Any:
        log.hit("w")
        return await ctx.step.wait_for_signal("go")

    @wf.stage(retry=ONCE)
    async def q(ctx: StageContext[Num]) -> str:
        log.hit("q")
        await eventually(
            lambda: any(
                e.type == "stage.suspended" and e.stage == "w" for e in sink.for_run(ctx.run_id)
            ),
            BARRIER,
            what="w to suspend",
        )
        return "q-out"

    return wf


class ParallelSignalContract:
    """Stages of one parallel group take buffered and late signals concurrently."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_parallel_waits_share_buffered_signals(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        opened: dict[str, bool] = {}
        wf = buffered_pair(log, sink, opened)
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await eventually(lambda: log.count("gate") == 1, BARRIER, what="gate to run")
            for n in (1, 2):
                sent = await engine.signal(run.id, "a", {"n": n})
                assert (sent.delivered, sent.already_completed) == (False, False)  # buffered
            opened["gate"] = True
            info = await engine.wait(run.id, timeout=90)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED, run_summary(info)
        outputs = [info.stage("x").output, info.stage("y").output]
        assert sorted(o["n"] for o in outputs) == [1, 2]  # one payload each, none twice
        assert log.counts() == {"gate": 1, "x": 1, "y": 1, "z": 1}  # nobody suspended
        # nothing waited for z: x and y completed while z was still running
        z_done = _seq(events, "stage.completed", "z")
        assert _seq(events, "stage.completed", "x") < z_done
        assert _seq(events, "stage.completed", "y") < z_done
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "gate", 1],
            ["stage.completed", "gate", 1],
            ["stage.started", "x", 1],
            ["stage.completed", "x", 1],
            ["stage.started", "y", 1],
            ["stage.completed", "y", 1],
            ["stage.started", "z", 1],
            ["stage.completed", "z", 1],
            ["run.completed"],
        ]
        check_golden("par_signals_buffered", {"trace": trace, "run": run_summary(info)})

    async def test_parallel_wait_resumes_while_sibling_runs(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        opened: dict[str, bool] = {}
        wf = resume_while_sibling_runs(log, sink, opened)
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await eventually(lambda: log.count("gate") == 1, BARRIER, what="gate to run")
            early = await engine.signal(run.id, "c", {"early": True})
            assert (early.delivered, early.already_completed) == (False, False)  # buffered
            opened["gate"] = True
            await eventually(
                lambda: (
                    log.count("x-step") == 1
                    and any(
                        e.type == "stage.suspended" and e.stage == "y" for e in sink.for_run(run.id)
                    )
                ),
                BARRIER,
                what="x in its step and y suspended on b",
            )
            sent = await engine.signal(run.id, "b", {"late": True})
            assert (sent.delivered, sent.already_completed) == (True, False)
            info = await engine.wait(run.id, timeout=90)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED, run_summary(info)
        assert info.stage("y").output == {"late": True}
        assert info.stage("x").output == {"took": {"early": True}, "step": "y was done"}
        # y resumed and completed while x was still in its step
        assert _seq(events, "stage.completed", "y") < _seq(events, "stage.completed", "x")
        assert log.counts() == {"gate": 1, "x": 1, "x-step": 1, "y": 2}
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "gate", 1],
            ["stage.completed", "gate", 1],
            ["stage.started", "x", 1],
            ["stage.completed", "x", 1],
            ["stage.started", "y", 1],
            ["stage.suspended", "y", "signal", "signal:b"],
            ["stage.completed", "y", 1],
            ["run.completed"],
        ]
        check_golden("par_signals_resume", {"trace": trace, "run": run_summary(info)})

    async def test_a_run_is_suspended_once_its_last_busy_sibling_completes(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        wf = last_busy_sibling(log, sink)
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.completed")

            async def suspended() -> bool:
                return (await engine.get_run(run.id)).status == RunStatus.SUSPENDED

            await eventually(suspended, BARRIER, what="the run suspended once q completed")
            sent = await engine.signal(run.id, "go", {"ok": True})
            assert (sent.delivered, sent.already_completed) == (True, False)
            info = await engine.wait(run.id, timeout=90)
        assert info.status == RunStatus.COMPLETED, run_summary(info)
        assert info.stage("w").output == {"ok": True} and info.stage("q").output == "q-out"
        assert log.counts() == {"w": 2, "q": 1}
