"""Scenarios: compensation (saga), staged business events, cancel, redrive (S4, S5, S10,
S12)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from engine_port import (
    MemorySink,
    NonRetryableError,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)
from engine_port.driver import StepEntry
from engine_port.errors import RunNotActiveError

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._models import Num
from ._trace import check_golden, normalise, run_summary

__all__ = ["CancelContract", "CompensationContract", "RedriveContract"]

QUICK = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=20))


def saga(
    log: ExecutionLog,
    fail_at: str | None,
    flags: dict[str, bool] | None = None,
    failing_compensation: str | None = None,
) -> Workflow[Num]:
    """a -> b -> c -> d, a and b compensable, a emits a business event."""
    wf = Workflow(unique_id("saga"), input=Num)
    flags = flags if flags is not None else {}

    def body(name: str) -> Any:
        async def run(ctx: StageContext[Num]) -> str:
            log.hit(name)
            if name == "a":
                ctx.emit("a.done", {"n": ctx.input.n})
            if name == fail_at and not flags.get("fixed"):
                raise NonRetryableError(f"{name} broke")
            return f"{name}-out"

        run.__name__ = name
        return run

    a = wf.stage(id="a", retry=QUICK)(body("a"))
    b = wf.stage(id="b", after=[a], retry=QUICK)(body("b"))
    c = wf.stage(id="c", after=[b], retry=QUICK)(body("c"))
    wf.stage(id="d", after=[c], retry=QUICK)(body("d"))

    def comp(name: str) -> Any:
        async def undo(ctx: StageContext[Num], output: str) -> None:
            log.hit(f"undo-{name}")
            assert output == f"{name}-out"
            if name == failing_compensation:
                raise RuntimeError(f"cannot undo {name}")

        return undo

    a.compensation(comp("a"))
    b.compensation(comp("b"))
    return wf


def journaled(log: ExecutionLog, flags: dict[str, bool]) -> Workflow[Num]:
    """a -> b -> c with durable steps, each logged when its body runs: a reserves (its
    compensation releases), b charges and waits for the signal ``approve``, c packs, breaks
    until ``flags["fixed"]``, then ships."""
    wf = Workflow(unique_id("steps"), input=Num)

    def step(name: str) -> Any:
        def body() -> str:
            log.hit(name)
            return name

        return body

    @wf.stage(retry=QUICK)
    async def a(ctx: StageContext[Num]) -> str:
        reserved: str = await ctx.step.run("reserve", step("reserve"))
        return reserved

    @a.compensation
    async def release(ctx: StageContext[Num], output: str) -> None:
        await ctx.step.run("release", step("release"))

    @wf.stage(after=[a], signals=["approve"], retry=QUICK)
    async def b(ctx: StageContext[Num]) -> Any:
        await ctx.step.run("charge", step("charge"))
        return await ctx.step.wait_for_signal("approve")

    @wf.stage(after=[b], retry=QUICK)
    async def c(ctx: StageContext[Num]) -> str:
        await ctx.step.run("pack", step("pack"))
        if not flags.get("fixed"):
            raise NonRetryableError("c broke")
        shipped: str = await ctx.step.run("ship", step("ship"))
        return shipped

    return wf


class CompensationContract:
    """S4, S5: compensation in reverse completion order; business events discarded."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s4_failure_compensates_in_reverse(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = saga(log, fail_at="c")
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 1})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.stage == "c"
        assert info.error.type == "NonRetryableError" and "c broke" in info.error.message
        assert {s.id: s.status for s in info.stages} == {
            "a": "compensated",
            "b": "compensated",
            "c": "failed",
            "d": "skipped",
        }
        entries = log.entries()
        assert entries == ["a", "b", "c", "undo-b", "undo-a"]
        assert not any(e.business for e in events)
        trace = normalise(events, wf.graph())
        assert trace[-5:] == [
            ["stage.started", "c", 1],
            ["stage.failed", "c", 1, "NonRetryableError", False],
            ["stage.compensated", "b"],
            ["stage.compensated", "a"],
            ["run.failed", "NonRetryableError", None],
        ]
        check_golden("s4_compensation", {"trace": trace, "run": run_summary(info), "log": entries})

    @pytest.mark.parametrize("fail_at", ["a", "b", "d"])
    async def test_failure_at_each_position(
        self, harness: Harness, tmp_path: Path, fail_at: str
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = saga(log, fail_at=fail_at)
        info: Any
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 1})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        order = ["a", "b", "c", "d"]
        done = order[: order.index(fail_at)]
        expected_undo = [f"undo-{s}" for s in reversed(done) if s in ("a", "b")]
        assert log.entries() == [*done, fail_at, *expected_undo]
        assert [e.stage for e in events if e.type == "stage.compensated"] == [
            u.removeprefix("undo-") for u in expected_undo
        ]
        assert info.status == RunStatus.FAILED
        check_golden(
            f"s4_fail_at_{fail_at}",
            {"trace": normalise(events, wf.graph()), "run": run_summary(info)},
        )

    async def test_s5_failing_compensation(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = saga(log, fail_at="c", failing_compensation="a")
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 1})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.stage == "c"  # the original error stays
        assert [(e.type, e.stage) for e in info.compensation_errors] == [("RuntimeError", "a")]
        assert info.stage("a").status == "completed"
        assert info.stage("a").compensation_error is not None
        assert info.stage("b").status == "compensated"
        assert log.count("undo-a") == QUICK.max_attempts  # retried, then given up
        trace = normalise(events, wf.graph())
        assert trace[-2:] == [["stage.compensated", "b"], ["run.failed", "NonRetryableError", None]]
        check_golden("s5_failing_compensation", {"trace": trace, "run": run_summary(info)})

    async def test_business_events_released_on_completion(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = saga(log, fail_at=None)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 3})
            await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert [e.type for e in events[-2:]] == ["a.done", "run.completed"]
        assert events[-2].business and events[-2].data == {"n": 3} and events[-2].stage == "a"


class CancelContract:
    """S10: cancel while suspended and while running."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    def _waiting(self, log: ExecutionLog) -> Workflow[Num]:
        wf = Workflow(unique_id("s10"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> str:
            log.hit("a")
            return "a"

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> str:
            log.hit("b")
            return "b"

        @wf.stage(after=[b])
        async def c(ctx: StageContext[Num]) -> Any:
            log.hit("c")
            return await ctx.step.wait_for_signal("go")

        @a.compensation
        async def undo_a(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")

        @b.compensation
        async def undo_b(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-b")

        return wf

    async def test_s10_cancel_while_suspended(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = self._waiting(log)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.suspended")
            # with a worker serving the run, cancel() returns it once it has ended (native
            # returned it `compensating`, Temporal `cancelled`)
            first = await engine.cancel(run.id)
            assert first.status == RunStatus.CANCELLED, run_summary(first)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.cancelled")
            again = await engine.cancel(run.id)  # a no-op
            assert again.status == RunStatus.CANCELLED
            with pytest.raises(RunNotActiveError):
                await engine.signal(run.id, "go", {})
        assert info.status == RunStatus.CANCELLED
        assert {s.id: s.status for s in info.stages} == {
            "a": "compensated",
            "b": "compensated",
            "c": "cancelled",
        }
        assert log.entries() == ["a", "b", "c", "undo-b", "undo-a"]
        trace = normalise(events, wf.graph())
        assert trace[-4:] == [
            ["stage.cancelled", "c"],
            ["stage.compensated", "b"],
            ["stage.compensated", "a"],
            ["run.cancelled"],
        ]
        check_golden("s10_cancel_suspended", {"trace": trace, "run": run_summary(info)})

    async def test_cancel_running_stage(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s10r"), input=Num)
        late: dict[str, bool] = {}

        @wf.stage
        async def a(ctx: StageContext[Num]) -> str:
            log.hit("a")
            return "a"

        @wf.stage(after=[a])
        async def slow(ctx: StageContext[Num]) -> str:
            log.hit("slow")
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                log.hit("slow-saw-cancel")
                raise
            late["done"] = True
            return "late"

        @a.compensation
        async def undo(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await eventually(lambda: log.count("slow") == 1, what="slow to start")
            await engine.cancel(run.id)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.cancelled")
        assert info.status == RunStatus.CANCELLED
        assert log.count("slow-saw-cancel") == 1 and not late
        assert info.stage("slow").status == "cancelled"
        assert info.stage("a").status == "compensated"
        trace = normalise(events, wf.graph())
        assert trace[-3:] == [
            ["stage.cancelled", "slow"],
            ["stage.compensated", "a"],
            ["run.cancelled"],
        ]

    async def test_cancel_while_compensating_is_a_no_op(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """A cancel that arrives while a failed run compensates changes nothing: the
        compensation runs to its end once and the run ends failed with its own error."""
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s10c"), input=Num)
        release = asyncio.Event()

        @wf.stage
        async def a(ctx: StageContext[Num]) -> str:
            return "a"

        @a.compensation
        async def undo(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")
            await release.wait()

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> str:
            raise NonRetryableError("b broke")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await eventually(lambda: log.count("undo-a") == 1, what="the compensation to run")
            first = await engine.cancel(run.id)
            assert first.status == RunStatus.COMPENSATING
            # while it compensates, the run already says why it failed
            assert first.error is not None and first.error.type == "NonRetryableError"
            now = await engine.get_run(run.id)
            assert now.error is not None and now.error.type == "NonRetryableError"
            release.set()
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "NonRetryableError"
        assert log.counts() == {"undo-a": 1}
        trace = normalise(events, wf.graph())
        assert trace[-4:] == [
            ["stage.started", "b", 1],
            ["stage.failed", "b", 1, "NonRetryableError", False],
            ["stage.compensated", "a"],
            ["run.failed", "NonRetryableError", None],
        ]

    async def test_cancel_terminal_run_raises(self, harness: Harness) -> None:
        wf = Workflow(unique_id("s10t"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            return 1

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await engine.wait(run.id, timeout=60)
            with pytest.raises(RunNotActiveError):
                await engine.cancel(run.id)


class RedriveContract:
    """S12: redrive from the last failure, from the start and from a stage."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s12_redrive(self, harness: Harness, tmp_path: Path) -> None:
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        log = ExecutionLog(tmp_path / "log")
        flags: dict[str, bool] = {}
        wf = saga(log, fail_at="c", flags=flags)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 1})
            failed = await engine.wait(run.id, timeout=60)
            assert failed.status == RunStatus.FAILED
            await wait_for_events(sink, run.id, "run.failed")
            flags["fixed"] = True
            redriven = await engine.redrive(run.id, from_="last_failure")
            assert redriven.id == run.id
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
            assert info.status == RunStatus.COMPLETED and info.output == "d-out"
            assert log.counts() == {"a": 1, "b": 1, "c": 2, "d": 1, "undo-a": 1, "undo-b": 1}
            trace = normalise(events, wf.graph())
            tail = trace[trace.index(["run.redriven", "last_failure"]) :]
            assert tail == [
                ["run.redriven", "last_failure"],
                ["stage.started", "c", 1],
                ["stage.completed", "c", 1],
                ["stage.started", "d", 1],
                ["stage.completed", "d", 1],
                # a's business event was discarded by the compensation and a is not re-run
                ["run.completed"],
            ]
            check_golden("s12_redrive_last_failure", {"trace": trace, "run": run_summary(info)})

            # listed once, as it is now (Temporal listed the failed execution beside the new one)
            async def listed_once() -> bool:
                runs = await engine.list_runs(workflow_id=wf.id)
                failed = await engine.list_runs(workflow_id=wf.id, status=RunStatus.FAILED)
                once = [(r.id, r.status) for r in runs] == [(run.id, "completed")] and not failed
                paged = getattr(engine, "list_runs_page", None)  # (the drivers' web view call)
                if once and paged is not None:
                    page, _ = await paged(workflow_id=wf.id)
                    once = [(r.id, r.status) for r in page] == [(run.id, "completed")]
                return once

            await eventually(listed_once, interval=0.2, what="the run listed once, completed")

            again = await engine.redrive(run.id, from_="b")
            assert again.id == run.id
            await engine.wait(run.id, timeout=60)
            await eventually(
                lambda: sum(e.type == "run.completed" for e in sink.for_run(run.id)) == 2
            )
            assert log.counts()["a"] == 1 and log.counts()["b"] == 2 and log.counts()["c"] == 3

            await engine.redrive(run.id, from_="start")
            final = await engine.wait(run.id, timeout=60)
            assert final.status == RunStatus.COMPLETED and final.redrive_count == 3
            counts = log.counts()
            assert (counts["a"], counts["b"], counts["c"], counts["d"]) == (2, 3, 4, 3)

    async def test_steps_after_compensation_and_redrives(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """``engine.steps(run)`` lists each stage's journaled steps by stage and name, a
        compensation's under ``<stage>#compensation``, a signal wait with its signal name and
        whether it completed. A redrive from the last failure keeps the failed stage's steps
        (c's pack is not run again); one from a stage journals the stages it re-runs anew;
        the kept stages' steps stay listed, an earlier compensation's do not (a compensation
        after a redrive is a new one)."""
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        log = ExecutionLog(tmp_path / "log")
        flags: dict[str, bool] = {}
        wf = journaled(log, flags)

        def ran(stage: str, name: str) -> StepEntry:
            return StepEntry(stage=stage, name=name, kind="run", completed=True)

        def approve(completed: bool) -> StepEntry:
            return StepEntry(
                stage="b", name="approve", kind="signal", completed=completed, signal="approve"
            )

        reserve, release = ran("a", "reserve"), ran("a#compensation", "release")
        charge, pack, ship = ran("b", "charge"), ran("c", "pack"), ran("c", "ship")

        def suspensions() -> int:
            return sum(e.type == "stage.suspended" for e in sink.for_run(run.id))

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 1})
            await wait_for_events(sink, run.id, "stage.suspended")
            assert await engine.steps(run.id) == [reserve, approve(False), charge]
            await engine.signal(run.id, "approve", {"ok": True})
            failed = await engine.wait(run.id, timeout=60)
            assert failed.status == RunStatus.FAILED
            assert failed.stage("a").status == "compensated"
            assert await engine.steps(run.id) == [reserve, release, approve(True), charge, pack]

            flags["fixed"] = True
            await engine.redrive(run.id, from_="last_failure")
            done = await engine.wait(run.id, timeout=60)
            assert done.status == RunStatus.COMPLETED
            shipped = [reserve, approve(True), charge, pack, ship]
            assert await engine.steps(run.id) == shipped

            await engine.redrive(run.id, from_="b")
            await eventually(lambda: suspensions() == 2, what="b to wait again")
            assert await engine.steps(run.id) == [reserve, approve(False), charge]
            await engine.signal(run.id, "approve", {"ok": True})
            final = await engine.wait(run.id, timeout=60)
            assert final.status == RunStatus.COMPLETED
            assert await engine.steps(run.id) == shipped
        assert log.counts() == {"reserve": 1, "charge": 2, "pack": 2, "release": 1, "ship": 2}

    async def test_a_failure_after_a_redrive_compensates_again(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """A run redriven after its compensation, failing again, compensates its completed
        stages again, running the compensation's steps anew. Natively a redrive wrote the
        stages' ``compensation_error`` as JSON 'null', which read as "its compensation
        failed": the second failure compensated nothing (stage a stayed ``completed``), and
        the compensation's journaled steps would have been replayed, not run."""
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        log = ExecutionLog(tmp_path / "log")
        wf = journaled(log, {})
        sink = MemorySink()

        def at_least(event_type: str, n: int) -> bool:
            return sum(e.type == event_type for e in sink.for_run(run.id)) >= n

        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {"n": 1})
            for cycle in (1, 2):
                if cycle == 2:
                    await engine.redrive(run.id, from_="b")
                await eventually(partial(at_least, "stage.suspended", cycle), what="b's wait")
                await engine.signal(run.id, "approve", {"ok": cycle})
                info = await engine.wait(run.id, timeout=60)
                assert info.status == RunStatus.FAILED, cycle
                assert info.stage("a").status == "compensated", cycle
                assert log.count("release") == cycle
                await eventually(partial(at_least, "stage.compensated", cycle), what="events")
        assert [e.type for e in sink.for_run(run.id)].count("stage.compensated") == 2

    async def test_redrive_bad_input(self, harness: Harness) -> None:
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        from engine_port.errors import InvalidRedriveError, RunNotFoundError

        wf = Workflow(unique_id("s12b"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            await ctx.step.wait_for_signal("go")
            return 1

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            with pytest.raises(RunNotFoundError):
                await engine.redrive("no-such-run")
            run = await engine.start(wf.id, {})
            with pytest.raises(RunNotActiveError):
                await engine.redrive(run.id)  # still active
            await engine.cancel(run.id)
            await engine.wait(run.id, timeout=60)
            with pytest.raises(InvalidRedriveError):
                await engine.redrive(run.id, from_="nope")
