"""The events a run hands the sink while the workflow task that ends it runs, when Temporal
refuses that task's completion: every event reaches the sink with one sequence number, no two
events share one, and none of them never happened (DESIGN §5, events).

How it went wrong: the worker running a run's last workflow task delivers its last events
(the last stage.completed, run.completed, ...) *during* that task (``_outbox._record_end``,
``_run_end.RunEnds.record``), before the task's completion reaches Temporal. A cancel (an
``engine.cancel``, which sends the same request, or a raw ``handle.cancel()``), a signal or an
update that reaches the run while that task runs makes the server refuse the completion
(UnhandledCommand); the task runs again with it, and a cancel takes another path: the run
ended cancelled, and the sink held the refused task's run.completed (seq 7, which never
happened) and the run.cancelled of the task that ran again, seq 7 too.

Cause: the events of the task that ends the run reach the sink from inside that task
(``_record_end`` -> the worker's ``RUN_ENDED``, which delivers before the task's completion is
sent), and nothing pinned the path the task took: the rerun is not a replay of it (its commands
were never recorded) and applied the cancel with the last stage's result.

Fix (runs started with ``StartDocument.end_beats_cancel``): a cancel that reaches a run whose end
is decided (every stage completed, or one failed for good with nothing of its group in flight)
is too late (``GraphWorkflow._end_decided``): Temporal's history holds the last outcome before the
cancel request, as a cancel committed after the last outcome on the native driver finds the run
ended. The rerun then ends as the refused task did, with the same events. (A fix tried before,
an end decided in one task and recorded in the next behind a no-op activity, cost every run an
activity round trip and 6 history events.) The signal case (nothing waits for the signal once
every stage completed) took the same path again before the fix too.

Still open (``xfail(strict=True)``): a run of ``local=True`` stages whose first workflow task ran
it whole (its local activities, then its end) and was refused: the rerun starts with the cancel
in its first activation, before any stage, and ends the run cancelled; every event the refused
task handed over (run.started ... run.completed) never happened, and run.cancelled takes seq 2.
The refused task's local activities are not in the history, so nothing the rerun sees tells it
what the refused task did; a fix needs the worker to hold a task's events until Temporal accepted
its completion.

The test forces the refusal: the first time a run records its end, a cancel (or a signal) of
it is sent, and accepted by Temporal, before the task completes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus

from driver_temporal._workflow import GraphWorkflow
from engine_port import (
    MemorySink,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)
from engine_port.errors import RunNotActiveError

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


async def _refused(engine: Any, run_id: str) -> int:
    history = await engine._conn.get_workflow_handle(run_id).fetch_history()
    return sum(
        1
        for e in history.events
        if e.HasField("workflow_task_failed_event_attributes")
        and "UNHANDLED_COMMAND" in str(e.workflow_task_failed_event_attributes)
    )


_LOCAL_REASON = (
    "a run of local=True stages ran whole in its first workflow task, refused: the rerun "
    "starts with the cancel and ends cancelled at once, every event of the refused task "
    "already at the sink (see the module docstring)"
)


@pytest.mark.parametrize(
    "how",
    [
        "cancel",
        "signal",
        "cancel-after-failure",
        pytest.param("cancel-local", marks=pytest.mark.xfail(strict=True, reason=_LOCAL_REASON)),
        pytest.param(
            "cancel-local-failure", marks=pytest.mark.xfail(strict=True, reason=_LOCAL_REASON)
        ),
    ],
)
async def test_a_refused_end_hands_no_event_numbered_again(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    wf = Workflow(f"end-refused-{how}-{time.monotonic_ns()}", input=In, version="v1")

    local = "local" in how

    @wf.stage(local=local)
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a], retry=Retry(max_attempts=1), local=local)
    async def b(ctx: StageContext[In]) -> int:
        if how.endswith("failure"):
            raise ValueError("b fails for good")
        return 2

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    loop = asyncio.get_running_loop()
    forced: list[str] = []
    real = GraphWorkflow._record_end

    def then_cancel(self: GraphWorkflow, state: dict[str, Any]) -> None:
        # (on the workflow task's thread) the first time the run records its end, once its
        # last events were handed over, a cancel (or signal) of it reaches Temporal before
        # the task completes: the server refuses the task's completion
        real(self, state)
        if not forced and not workflow.unsafe.is_replaying():
            forced.append(self._run_id)
            handle = engine._conn.get_workflow_handle(self._run_id)
            sent = handle.cancel() if how.startswith("cancel") else handle.signal("go", {"v": 1})
            asyncio.run_coroutine_threadsafe(sent, loop).result(1.5)

    monkeypatch.setattr(GraphWorkflow, "_record_end", then_cancel)
    async with engine:
        run = await engine.start(wf, {})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=120)
        refused = await _refused(engine, run.id)
        committed = await engine.events(run.id)
        got = await engine.get_run(run.id)
    assert forced == [run.id] and refused, "no end was refused: not the situation"
    by_id = {e.id: e for e in sink.events if e.run_id == run.id}
    seqs = sorted(e.seq for e in by_id.values())
    # before the fix (the cancel): [..., (7, run.completed), (7, run.cancelled)]
    assert seqs == list(range(1, len(seqs) + 1)), sorted((e.seq, e.type) for e in by_id.values())
    # the sink received exactly the events the run's committed workflow tasks emitted
    assert sorted(by_id) == sorted(e.id for e in committed)
    # the run ended as it ended, and says so everywhere
    last = [e.type for e in committed if e.type.startswith("run.")][-1]
    assert last == f"run.{info.status.value}" and info.status == got.status, (last, info, got)
    # the cancel came after the end was decided: the run ends as the refused task ended it
    # (before the fix: cancelled, its run.completed or run.failed already at the sink)
    decided = RunStatus.FAILED if how.endswith("failure") else RunStatus.COMPLETED
    assert got.status == decided, got


@pytest.mark.parametrize("decided", ["completed", "failed"])
async def test_engine_cancel_that_finds_the_run_ended_raises_as_on_native(
    make_engine: EngineFactory, decided: str
) -> None:
    """``engine.cancel`` of a run that ends as decided while the cancel is on its way (the
    last stage's outcome reaches Temporal between the cancel's read of the run and its
    request) raises ``RunNotActiveError`` with the status the run ended in, as on the native
    driver, where a cancel committed after the last outcome finds the run ended (DESIGN §5:
    cancelling a completed or failed run raises; a cancel that took ends the run
    ``cancelled``, even when a compensation fails). Before: ``cancel()`` returned the run
    ``completed`` (or ``failed``), as if it had taken the cancel."""
    wf = Workflow(f"cancel-too-late-{decided}-{time.monotonic_ns()}", input=In, version="v1")
    release = asyncio.Event()
    began: list[str] = []

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a], retry=Retry(max_attempts=1))
    async def b(ctx: StageContext[In]) -> int:
        began.append(ctx.run_id)
        await release.wait()
        if decided == "failed":
            raise ValueError("b fails for good")
        return 2

    engine = make_engine(Registry([wf]), sink=MemorySink())
    real = engine._describe
    held: list[str] = []

    async def describe_then_end(run_id: str, **kw: Any) -> Any:
        # the cancel's read of the run finds it running; its last stage then returns and
        # the run ends before the cancel request is sent
        got = await real(run_id, **kw)
        if not held:
            held.append(run_id)
            release.set()
            handle = engine._conn.get_workflow_handle(run_id)
            deadline = time.monotonic() + 120
            while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                assert time.monotonic() < deadline, "the run did not end"
                await asyncio.sleep(0.05)
        return got

    async with engine:
        run = await engine.start(wf, {})
        async with engine.worker():
            deadline = time.monotonic() + 120
            while not began:
                assert time.monotonic() < deadline, "stage b never began"
                await asyncio.sleep(0.05)
            engine._describe = describe_then_end  # type: ignore[method-assign]
            with pytest.raises(RunNotActiveError) as raised:
                await engine.cancel(run.id)
            engine._describe = real  # type: ignore[method-assign]
            info = await engine.wait(run.id, timeout=120)
        got = await engine.get_run(run.id)
    assert held == [run.id]
    assert info.status == got.status == RunStatus(decided), (info, got)
    assert f"it is {decided}" in str(raised.value), raised.value


async def _signalled(engine: Any, run_id: str) -> None:
    """Until Temporal recorded a signal of the run (the caller bounds the wait)."""
    handle = engine._conn.get_workflow_handle(run_id)
    while True:
        history = await handle.fetch_history()
        if any(e.HasField("workflow_execution_signaled_event_attributes") for e in history.events):
            return
        await asyncio.sleep(0.02)


async def test_engine_signal_after_the_end_was_decided_raises_as_on_native(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``engine.signal`` that reaches a run while the workflow task that ends it runs (the
    server refuses that task and hands it out again with the signal) raises
    ``RunNotActiveError``, as on the native driver, where a signal committed after the run's
    last outcome finds the run ended. Before: it reported the signal ``buffered``
    (``delivered=False``) for a run that ended without ever taking it: temporalio hands a
    task's signals to their handlers before its activity results, so the handler queued it
    while the last stage still looked in flight."""
    wf = Workflow(f"signal-too-late-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a], signals=["go"])
    async def b(ctx: StageContext[In]) -> int:
        return 2  # (declares the signal, never waits for it)

    engine = make_engine(Registry([wf]), sink=MemorySink())
    loop = asyncio.get_running_loop()
    sent: list[Any] = []
    real = GraphWorkflow._record_end

    def then_signal(self: GraphWorkflow, state: dict[str, Any]) -> None:
        # (on the workflow task's thread) the first time the run records its end, the
        # engine's signal to it reaches Temporal before the task completes
        real(self, state)
        if not sent and not workflow.unsafe.is_replaying():
            signal = engine.signal(self._run_id, "go", {"v": 1})
            sent.append(asyncio.run_coroutine_threadsafe(signal, loop))
            asyncio.run_coroutine_threadsafe(_signalled(engine, self._run_id), loop).result(1.5)

    monkeypatch.setattr(GraphWorkflow, "_record_end", then_signal)
    async with engine:
        run = await engine.start(wf, {})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=120)
            assert len(sent) == 1, "the signal was not sent: not the situation"
            with pytest.raises(RunNotActiveError) as raised:
                await asyncio.wait_for(asyncio.wrap_future(sent[0]), 120)
        refused = await _refused(engine, run.id)
    assert refused, "the end was not refused: not the situation"
    assert info.status == RunStatus.COMPLETED, info
    assert "it is completed" in str(raised.value), raised.value
