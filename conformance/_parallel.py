"""Scenarios: a failure inside a parallel group, and a cancel that arrives while the first
stage's attempt runs (DESIGN §5 "A failure inside a parallel group", "Cancel"; issue 10).

Every case is deterministic on every driver: stage bodies wait on barriers (the ExecutionLog,
the in-process MemorySink, a flag the test sets) with a deadline, never on a sleep that hopes
something happened meanwhile. Workers run in the test process (``engine.worker()``), so a body
can observe test-process state.

Group cases: ``a`` (compensable) -> (``fails``, sibling) -> ``z``. ``fails`` raises
NonRetryableError once the sibling reached the state the case needs; the sibling is:

- ``books``: running, shields itself from the cancellation until ``fails``'s ``stage.failed``
  reached the sink, then returns: it is ``completed`` and compensated before ``a``;
- ``stays``: running, waits forever and lets CancelledError propagate: ``cancelled``;
- ``waits``: suspended on a signal with no timeout: ``cancelled`` at once;
- ``naps``: suspended in a one-hour sleep: ``cancelled`` at once.

The run ends ``failed`` (error of ``fails``), ``z`` is ``skipped``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
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

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._models import Num
from ._trace import check_golden, normalise, run_summary

__all__ = ["ParallelFailureContract"]

ONCE = Retry(max_attempts=1)
BARRIER = 60.0  # seconds a body waits for its barrier before it fails the test


def _seen(sink: MemorySink, run_id: str, etype: str, stage: str) -> bool:
    return any(e.type == etype and e.stage == stage for e in sink.for_run(run_id))


async def _shielded(log: ExecutionLog, name: str, check: Any, what: str) -> None:
    """Wait for ``check`` with a deadline, ignoring cancellation (logged once as
    ``<name>-saw-cancel``)."""
    wait = asyncio.ensure_future(eventually(check, BARRIER, what=what))
    saw = False
    while True:
        try:
            await asyncio.shield(wait)
            return
        except asyncio.CancelledError:
            if wait.done():
                wait.result()
                return
            if not saw:
                saw = True
                log.hit(f"{name}-saw-cancel")


def group_failure(log: ExecutionLog, sink: MemorySink, sibling: str) -> Workflow[Num]:
    """a -> (fails, <sibling>) -> z; a and the sibling are compensable."""
    wf = Workflow(unique_id(f"par-{sibling}"), input=Num)

    @wf.stage(retry=ONCE)
    async def a(ctx: StageContext[Num]) -> str:
        log.hit("a")
        return "a-out"

    def ready(ctx: StageContext[Num]) -> bool:
        if sibling in ("books", "stays"):  # running
            return log.count(sibling) >= 1
        return _seen(sink, ctx.run_id, "stage.suspended", sibling)  # suspended

    @wf.stage(after=[a], retry=ONCE)
    async def fails(ctx: StageContext[Num]) -> str:
        log.hit("fails")
        await eventually(lambda: ready(ctx), BARRIER, what=f"{sibling} to be under way")
        raise NonRetryableError("fails broke")

    async def body(ctx: StageContext[Num]) -> Any:
        log.hit(sibling)
        if sibling == "books":
            # returns even when cancelled: its side effect happened, so it is compensated
            await _shielded(
                log,
                "books",
                lambda: _seen(sink, ctx.run_id, "stage.failed", "fails"),
                "stage.failed of fails",
            )
            return "booked"
        if sibling == "stays":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                log.hit("stays-saw-cancel")
                raise
            return "stayed"
        if sibling == "waits":
            return await ctx.step.wait_for_signal("go")
        await ctx.step.sleep("nap", timedelta(hours=1))
        return "napped"

    body.__name__ = sibling
    sib = wf.stage(id=sibling, after=[a], retry=ONCE)(body)

    @wf.stage(after=[fails, sib], retry=ONCE)
    async def z(ctx: StageContext[Num]) -> str:
        log.hit("z")
        return "z-out"

    @a.compensation
    async def undo_a(ctx: StageContext[Num], output: str) -> None:
        log.hit("undo-a")

    @sib.compensation
    async def undo_sibling(ctx: StageContext[Num], output: Any) -> None:
        log.hit(f"undo-{sibling}")

    return wf


def first_stage(log: ExecutionLog, released: dict[str, bool], mode: str) -> Workflow[Num]:
    """first -> second; first ignores cancellation until the test releases it, then
    suspends on a signal (``mode="suspends"``) or returns (``mode="returns"``)."""
    wf = Workflow(unique_id(f"cfirst-{mode}"), input=Num)

    @wf.stage(retry=ONCE)
    async def first(ctx: StageContext[Num]) -> Any:
        log.hit("first")
        await _shielded(log, "first", lambda: released.get("go"), "the test to release first")
        if mode == "suspends":
            return await ctx.step.wait_for_signal("go")
        return "first-out"

    @wf.stage(after=[first], retry=ONCE)
    async def second(ctx: StageContext[Num]) -> str:
        log.hit("second")
        return "second-out"

    @first.compensation
    async def undo_first(ctx: StageContext[Num], output: Any) -> None:
        log.hit("undo-first")

    return wf


class ParallelFailureContract:
    """A stage failing for good stops its group at once; a cancel during the first stage's
    attempt ends the run cancelled in bounded time."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def _fail_group(
        self, harness: Harness, tmp_path: Path, sibling: str
    ) -> tuple[Any, list[list[Any]], ExecutionLog]:
        log = ExecutionLog(tmp_path / "log")
        sink = MemorySink()
        wf = group_failure(log, sink, sibling)
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=90)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED, run_summary(info)
        assert info.error is not None and info.error.stage == "fails"
        assert info.error.type == "NonRetryableError" and "fails broke" in info.error.message
        trace = normalise(events, wf.graph())
        check_golden(
            f"par_fail_{sibling}",
            {"trace": trace, "run": run_summary(info), "log": _counts(log)},
        )
        return info, trace, log

    async def test_parallel_sibling_returns_is_compensated(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        info, trace, log = await self._fail_group(harness, tmp_path, "books")
        assert run_summary(info)["stages"] == {
            "a": "compensated",
            "fails": "failed",
            "books": "compensated",
            "z": "skipped",
        }
        undo = [e for e in log.entries() if e.startswith("undo-")]
        assert undo == ["undo-books", "undo-a"]  # reverse completion order
        assert log.count("books") == 1 and log.count("z") == 0
        assert trace[-3:] == [
            ["stage.compensated", "books"],
            ["stage.compensated", "a"],
            ["run.failed", "NonRetryableError", None],
        ]
        assert ["stage.completed", "books", 1] in trace

    async def test_parallel_running_sibling_cancelled(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        info, trace, log = await self._fail_group(harness, tmp_path, "stays")
        assert run_summary(info)["stages"] == {
            "a": "compensated",
            "fails": "failed",
            "stays": "cancelled",
            "z": "skipped",
        }
        assert log.count("stays-saw-cancel") == 1  # the body saw the cancellation
        assert log.count("undo-stays") == 0 and log.count("undo-a") == 1
        assert trace[-3:] == [
            ["stage.cancelled", "stays"],
            ["stage.compensated", "a"],
            ["run.failed", "NonRetryableError", None],
        ]

    @pytest.mark.parametrize("sibling", ["waits", "naps"])
    async def test_parallel_suspended_sibling_cancelled(
        self, harness: Harness, tmp_path: Path, sibling: str
    ) -> None:
        info, trace, log = await self._fail_group(harness, tmp_path, sibling)
        assert run_summary(info)["stages"] == {
            "a": "compensated",
            "fails": "failed",
            sibling: "cancelled",
            "z": "skipped",
        }
        assert log.count(f"undo-{sibling}") == 0 and log.count("undo-a") == 1
        assert info.stage(sibling).waiting_for is None
        assert trace[-3:] == [
            ["stage.cancelled", sibling],
            ["stage.compensated", "a"],
            ["run.failed", "NonRetryableError", None],
        ]

    @pytest.mark.parametrize("mode", ["suspends", "returns"])
    async def test_parallel_cancel_during_first_stage(
        self, harness: Harness, tmp_path: Path, mode: str
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        released: dict[str, bool] = {}
        wf = first_stage(log, released, mode)
        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await eventually(lambda: log.count("first") == 1, what="first to run")
            await engine.cancel(run.id)
            released["go"] = True  # the body goes on, whether or not it saw the cancel
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.cancelled")
            again = await engine.cancel(run.id)  # a no-op
            assert again.status == RunStatus.CANCELLED
            assert len(sink.for_run(run.id)) == len(events)
        assert info.status == RunStatus.CANCELLED, run_summary(info)
        # its late result is discarded (S10): cancelled, not completed, never compensated
        assert run_summary(info)["stages"] == {"first": "cancelled", "second": "skipped"}
        assert log.count("undo-first") == 0 and log.count("second") == 0
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "first", 1],
            ["stage.cancelled", "first"],
            ["run.cancelled"],
        ]
        check_golden(f"par_cancel_first_{mode}", {"trace": trace, "run": run_summary(info)})


def _counts(log: ExecutionLog) -> dict[str, int]:
    """Body and compensation counts, without the timing-dependent ``*-saw-cancel`` marks."""
    return {k: v for k, v in log.counts().items() if not k.endswith("-saw-cancel")}
