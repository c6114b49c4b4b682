"""Scenarios: the corners the contract's prose leaves to be read (DESIGN §5 "Saga", "Cancel",
"Redrive", "Signals"), pinned as every driver behaves and as the fuzzer's model draws them:

- a cancelled run whose compensation fails stays ``cancelled`` (what was asked for, as a
  failed run keeps its stage's error), the compensation's error recorded in
  ``compensation_errors`` and its stage left ``completed``;
- a redrive after a failure that cancelled siblings re-runs the failed stage and those
  siblings (each from attempt 1, its journaled steps kept), keeps the siblings that completed;
- a redrive that fails again compensates again and ends ``failed`` with the new error; a
  second redrive goes on from there;
- a cancel after a redrive compensates the completed stages again (the kept ones too) and ends
  the run ``cancelled``, also while the redriven stage itself waits (it ends ``cancelled``);
- a signal racing a wait's timeout is never lost: the wait takes it, or it stays queued for
  the next wait for its name (which of the two is up to timing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine_port import (
    Event,
    MemorySink,
    NonRetryableError,
    Registry,
    Retry,
    RunInfo,
    RunStatus,
    Stage,
    StageContext,
    Workflow,
    WorkflowEngine,
)
from engine_port.errors import StepTimeoutError

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._models import Num
from ._trace import normalise, run_summary

__all__ = ["CornerContract"]

ONCE = Retry(max_attempts=1)
QUICK = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=20))


def _count(sink: MemorySink, run_id: str, etype: str, stage: str | None = None) -> int:
    return sum(
        e.type == etype and (stage is None or e.stage == stage) for e in sink.for_run(run_id)
    )


def _logged(log: ExecutionLog, name: str) -> Any:
    def step() -> str:
        log.hit(name)
        return name

    return step


def _waiting(wf: Workflow[Num], log: ExecutionLog, *, after: list[Stage]) -> Stage:
    """A stage ``waits`` that logs its run, journals a step ``prep``, then waits for ``go``
    (its output is the signal's payload)."""

    async def body(ctx: StageContext[Num]) -> Any:
        log.hit("waits")
        await ctx.step.run("prep", _logged(log, "prep"))
        return await ctx.step.wait_for_signal("go")

    return wf.stage(body, id="waits", after=after, retry=ONCE)


def _named(
    wf: Workflow[Num],
    log: ExecutionLog,
    name: str,
    *,
    after: list[Stage] | None = None,
    retry: Retry = QUICK,
) -> Stage:
    """A stage ``name`` that logs its run and returns its name."""

    async def body(ctx: StageContext[Num]) -> str:
        log.hit(name)
        return name

    return wf.stage(body, id=name, after=after or [], retry=retry)


async def _cancel_after_a_redrive(
    engine: WorkflowEngine,
    sink: MemorySink,
    wf: Workflow[Num],
    fixed: dict[str, bool],
    ready: Callable[[str], bool],
    what: str,
) -> tuple[RunInfo, RunInfo, list[Event]]:
    """Start ``wf``, let it fail for good, fix it (``fixed``), redrive it from the last
    failure, cancel it once ``ready(run_id)``: the cancel's answer, the run once ended, and
    its events up to ``run.cancelled``."""
    run = await engine.start(wf.id, {})
    failed = await engine.wait(run.id, timeout=60)
    assert failed.status == RunStatus.FAILED, run_summary(failed)
    await wait_for_events(sink, run.id, "run.failed", timeout=60)
    fixed["yes"] = True
    await engine.redrive(run.id, from_="last_failure")
    await eventually(lambda: ready(run.id), 60, what=what)
    first = await engine.cancel(run.id)
    info = await engine.wait(run.id, timeout=60)
    events = await wait_for_events(sink, run.id, "run.cancelled", timeout=60)
    return first, info, events


class CornerContract:
    """Cancel with a failing compensation, redrive after cancelled siblings, a redrive that
    fails again, a signal racing a timeout, a cancel after a redrive (and while the redriven
    stage waits)."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_cancel_with_a_failing_compensation_stays_cancelled(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("cfc"), input=Num)

        a = _named(wf, log, "a")
        b = _named(wf, log, "b", after=[a])

        @wf.stage(after=[b], retry=QUICK)
        async def c(ctx: StageContext[Num]) -> Any:
            log.hit("c")
            return await ctx.step.wait_for_signal("go")

        @a.compensation
        async def undo_a(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")
            raise RuntimeError("cannot undo a")

        @b.compensation
        async def undo_b(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-b")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended", timeout=60)
            first = await engine.cancel(run.id)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.cancelled", timeout=60)
            again = await engine.cancel(run.id)  # a no-op, as on any cancelled run
            listed = await engine.list_runs(workflow_id=wf.id, status=RunStatus.CANCELLED)
        assert first.status == RunStatus.CANCELLED, run_summary(first)
        assert again.status == RunStatus.CANCELLED
        assert [r.id for r in listed] == [run.id]
        assert run_summary(info) == {
            "status": "cancelled",
            "stages": {"a": "completed", "b": "compensated", "c": "cancelled"},
            "error": None,
            "compensation_errors": [["RuntimeError", "a"]],
        }
        assert "cannot undo a" in info.compensation_errors[0].message
        assert info.stage("a").compensation_error is not None
        assert log.count("undo-a") == QUICK.max_attempts and log.count("undo-b") == 1
        assert normalise(events, wf.graph())[-4:] == [
            ["stage.suspended", "c", "signal", "signal:go"],
            ["stage.cancelled", "c"],
            ["stage.compensated", "b"],
            ["run.cancelled"],
        ]

    async def test_redrive_reruns_the_siblings_a_failure_cancelled(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        fixed: dict[str, bool] = {}
        wf = Workflow(unique_id("rcs"), input=Num)

        a = _named(wf, log, "a", retry=ONCE)
        done = _named(wf, log, "done", after=[a], retry=ONCE)

        waits = _waiting(wf, log, after=[a])

        @wf.stage(after=[a], retry=ONCE)
        async def fails(ctx: StageContext[Num]) -> str:
            log.hit("fails")
            await eventually(
                lambda: (
                    _count(sink, ctx.run_id, "stage.suspended", "waits") >= 1
                    and _count(sink, ctx.run_id, "stage.completed", "done") >= 1
                ),
                60,
                what="waits suspended and done completed",
            )
            if not fixed:
                raise NonRetryableError("fails broke")
            return "fixed"

        @wf.stage(after=[done, waits, fails], retry=ONCE)
        async def z(ctx: StageContext[Num]) -> Any:
            log.hit("z")
            return [ctx.output_of("done"), ctx.output_of("waits"), ctx.output_of("fails")]

        @done.compensation
        async def undo_done(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-done")

        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            failed = await engine.wait(run.id, timeout=60)
            assert run_summary(failed)["stages"] == {
                "a": "completed",
                "done": "compensated",
                "fails": "failed",
                "waits": "cancelled",
                "z": "skipped",
            }
            await wait_for_events(sink, run.id, "run.failed", timeout=60)
            fixed["yes"] = True
            await engine.redrive(run.id, from_="last_failure")
            await eventually(
                lambda: _count(sink, run.id, "stage.suspended", "waits") == 2,
                60,
                what="waits to wait again",
            )
            sent = await engine.signal(run.id, "go", {"ok": 1})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed", timeout=60)
        assert sent.delivered
        assert info.status == RunStatus.COMPLETED, run_summary(info)
        assert info.output == ["done", {"ok": 1}, "fixed"]
        # the cancelled sibling ran again, its journaled step kept; the completed one is kept
        assert log.counts() == {
            "a": 1,
            "done": 1,
            "fails": 2,
            "waits": 3,
            "prep": 1,
            "undo-done": 1,
            "z": 1,
        }
        trace = normalise(events, wf.graph())
        assert trace[trace.index(["run.redriven", "last_failure"]) :] == [
            ["run.redriven", "last_failure"],
            ["stage.started", "fails", 1],
            ["stage.completed", "fails", 1],
            ["stage.started", "waits", 1],
            ["stage.suspended", "waits", "signal", "signal:go"],
            ["stage.completed", "waits", 1],
            ["stage.started", "z", 1],
            ["stage.completed", "z", 1],
            ["run.completed"],
        ]

    async def test_a_redrive_that_fails_again_then_one_that_completes(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        wf = Workflow(unique_id("rfa"), input=Num)

        a = _named(wf, log, "a")

        @wf.stage(after=[a], retry=QUICK)
        async def c(ctx: StageContext[Num]) -> str:
            log.hit("c")
            await ctx.step.run("pack", _logged(log, "pack"))
            if log.count("c") <= 4:  # both attempts of the run and of its first redrive
                raise RuntimeError(f"c broke {log.count('c')}")
            return "c"

        _named(wf, log, "d", after=[c])

        @a.compensation
        async def undo_a(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")

        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.wait(run.id, timeout=60)
            await wait_for_events(sink, run.id, "run.failed", timeout=60)
            await engine.redrive(run.id, from_="last_failure")
            again = await engine.wait(run.id, timeout=60)
            await eventually(lambda: _count(sink, run.id, "run.failed") == 2, 60, what="events")
            assert run_summary(again) == {
                "status": "failed",
                "stages": {"a": "compensated", "c": "failed", "d": "skipped"},
                "error": ["RuntimeError", "c"],
                "compensation_errors": [],
            }
            assert again.error is not None and again.error.message == "c broke 4"
            await engine.redrive(run.id, from_="last_failure")
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed", timeout=60)
        assert info.status == RunStatus.COMPLETED and info.redrive_count == 2
        assert log.counts() == {"a": 1, "c": 5, "pack": 1, "undo-a": 2, "d": 1}
        trace = normalise(events, wf.graph())
        redriven = ["run.redriven", "last_failure"]
        assert trace[trace.index(redriven) :] == [
            redriven,
            ["stage.started", "c", 1],
            ["stage.failed", "c", 1, "RuntimeError", True],
            ["stage.started", "c", 2],
            ["stage.failed", "c", 2, "RuntimeError", False],
            ["stage.compensated", "a"],
            ["run.failed", "RuntimeError", None],
            redriven,
            ["stage.started", "c", 1],
            ["stage.completed", "c", 1],
            ["stage.started", "d", 1],
            ["stage.completed", "d", 1],
            ["run.completed"],
        ]

    async def test_a_signal_racing_a_timeout_is_never_lost(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """A wait with a 500 ms timeout, then a wait with none for the same name; the signal
        goes about when the timeout falls (from well before to well after). Whichever came
        first, it is taken exactly once: by the first wait, or (that one timed out) by the
        second, at once or once it suspended. The test sends a second signal only when the
        first wait took the first one."""
        sink = MemorySink()
        first_got: dict[str, Any] = {}  # by run: what the first wait returned
        wf = Workflow(unique_id("race"), input=Num)

        @wf.stage(retry=ONCE)
        async def a(ctx: StageContext[Num]) -> Any:
            try:
                first = await ctx.step.wait_for_signal("go", timeout=timedelta(milliseconds=500))
            except StepTimeoutError:
                first = None
            first_got[ctx.run_id] = first
            return [first, await ctx.step.wait_for_signal("go")]

        async def one(engine: Any, lag: float) -> tuple[Any, int, bool]:
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended", timeout=60)
            await asyncio.sleep(lag)  # (not to order anything: either outcome is checked)
            await engine.signal(run.id, "go", {"sig": 1})

            def settled() -> bool:
                return _count(sink, run.id, "run.completed") > 0 or (
                    run.id in first_got and _count(sink, run.id, "stage.suspended") >= 2
                )

            await eventually(settled, 60, what="the race to settle")
            took = first_got.get(run.id) == {"sig": 1}
            if took:  # the second wait waits for a signal of its own
                await engine.signal(run.id, "go", {"sig": 2})
            info = await engine.wait(run.id, timeout=60)
            return info.output, _count(sink, run.id, "stage.suspended"), took

        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            got = await asyncio.gather(*(one(engine, lag) for lag in (0.2, 0.45, 0.5, 0.55, 0.8)))
        for output, suspensions, took in got:
            if took:
                assert output == [{"sig": 1}, {"sig": 2}] and suspensions == 2, got
            else:  # timed out: the signal stayed queued for the next wait, not lost
                assert output == [None, {"sig": 1}] and suspensions in (1, 2), got

    async def test_a_cancel_after_a_redrive_compensates_again(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """``waits`` waits for a signal, ``fails`` fails for good once it is suspended: the run
        fails, ``waits`` cancelled, ``a`` compensated. The redrive re-runs ``fails`` (now
        fixed: it completes) and ``waits``, which waits again; a cancel then ends the run
        ``cancelled``: ``waits`` cancelled, ``a`` compensated again (the kept stage, a second
        time), ``fails`` (no compensation) left completed, ``z`` never run."""
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        fixed: dict[str, bool] = {}
        wf = Workflow(unique_id("car"), input=Num)

        a = _named(wf, log, "a", retry=ONCE)

        waits = _waiting(wf, log, after=[a])

        @wf.stage(after=[a], retry=ONCE)
        async def fails(ctx: StageContext[Num]) -> str:
            log.hit("fails")
            await eventually(
                lambda: _count(sink, ctx.run_id, "stage.suspended", "waits") >= 1,
                60,
                what="waits suspended",
            )
            if not fixed:
                raise NonRetryableError("fails broke")
            return "fixed"

        _named(wf, log, "z", after=[waits, fails], retry=ONCE)

        @a.compensation
        async def undo_a(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")

        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            first, info, events = await _cancel_after_a_redrive(
                engine,
                sink,
                wf,
                fixed,
                lambda run_id: (
                    _count(sink, run_id, "stage.suspended", "waits") == 2
                    and _count(sink, run_id, "stage.completed", "fails") == 1
                ),
                "waits to wait again and fails to complete",
            )
            again = await engine.cancel(info.id)  # a no-op, as on any cancelled run
        assert first.status == RunStatus.CANCELLED, run_summary(first)
        assert again.status == RunStatus.CANCELLED
        assert info.redrive_count == 1
        assert run_summary(info) == {
            "status": "cancelled",
            "stages": {
                "a": "compensated",
                "fails": "completed",
                "waits": "cancelled",
                "z": "skipped",
            },
            "error": None,
            "compensation_errors": [],
        }
        assert log.counts() == {"a": 1, "waits": 2, "prep": 1, "fails": 2, "undo-a": 2}
        trace = normalise(events, wf.graph())
        tail = trace[trace.index(["run.redriven", "last_failure"]) :]
        assert tail[-3:] == [
            ["stage.cancelled", "waits"],
            ["stage.compensated", "a"],
            ["run.cancelled"],
        ]
        assert ["stage.started", "z", 1] not in tail

    async def test_a_cancel_while_the_redriven_stage_waits(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """``waits`` journals ``prep`` and fails for good before its wait in the first run:
        ``a`` compensated, the run failed. The redrive runs ``waits`` again (attempt 1, its
        journal kept: ``prep`` not run again), now fixed it waits for ``go``; a cancel while it
        waits ends the run ``cancelled``: ``waits`` cancelled (never completed: its
        compensation never runs), ``a`` compensated again, ``z`` never run."""
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        fixed: dict[str, bool] = {}
        wf = Workflow(unique_id("crh"), input=Num)

        a = _named(wf, log, "a", retry=ONCE)

        @wf.stage(after=[a], retry=ONCE)
        async def waits(ctx: StageContext[Num]) -> Any:
            log.hit("waits")
            await ctx.step.run("prep", _logged(log, "prep"))
            if not fixed:
                raise NonRetryableError("waits broke")
            return await ctx.step.wait_for_signal("go")

        _named(wf, log, "z", after=[waits], retry=ONCE)

        @a.compensation
        async def undo_a(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")

        @waits.compensation
        async def undo_waits(ctx: StageContext[Num], out: Any) -> None:
            log.hit("undo-waits")

        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            first, info, events = await _cancel_after_a_redrive(
                engine,
                sink,
                wf,
                fixed,
                lambda run_id: _count(sink, run_id, "stage.suspended", "waits") == 1,
                "the redriven waits to wait",
            )
        assert first.status == RunStatus.CANCELLED, run_summary(first)
        assert info.redrive_count == 1
        assert run_summary(info) == {
            "status": "cancelled",
            "stages": {"a": "compensated", "waits": "cancelled", "z": "skipped"},
            "error": None,
            "compensation_errors": [],
        }
        assert log.counts() == {"a": 1, "waits": 2, "prep": 1, "undo-a": 2}
        trace = normalise(events, wf.graph())
        redriven = ["run.redriven", "last_failure"]
        assert trace[trace.index(redriven) :] == [
            redriven,
            ["stage.started", "waits", 1],
            ["stage.suspended", "waits", "signal", "signal:go"],
            ["stage.cancelled", "waits"],
            ["stage.compensated", "a"],
            ["run.cancelled"],
        ]
