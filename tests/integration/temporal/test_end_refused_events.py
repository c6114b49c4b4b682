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
sent), and nothing pins the path the task took: the rerun is not a replay of it (its commands
were never recorded) and applies the cancel with the last stage's result. The cancel case is
``xfail(strict=True)`` until that is fixed; the signal case (nothing waits for the signal once
every stage completed) takes the same path again and passes.

A fix tried on 2026-12-06 and not landed (``StartDocument.end_commits_first``): the task
that decides the end commits only a no-op activity (``wfe.end_decided``, never refused),
and the task its result wakes emits, records
and hands over the last events; a refused completion then reruns the decided path. It passes
this test, the fuzzer and the replay tests, but costs every run one activity round trip (a
3-stage run ~150 ms -> ~200-235 ms median here, a local 3-stage run 1 -> 2 workflow tasks),
6 more history events (test_history's 1.5x bound against hand-written Temporal) and a
``wfe.end_decided`` activity in the Web UI's history: left for a decision.

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

from driver_temporal._workflow import GraphWorkflow
from engine_port import MemorySink, Registry, StageContext, Workflow

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


@pytest.mark.parametrize(
    "how",
    [
        pytest.param(
            "cancel",
            marks=pytest.mark.xfail(
                strict=True,
                reason="the refused end task's run.completed (seq k) reached the sink, then "
                "the rerun's run.cancelled, seq k too (see the module docstring)",
            ),
        ),
        "signal",
    ],
)
async def test_a_refused_end_hands_no_event_numbered_again(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    wf = Workflow(f"end-refused-{how}-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
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
            sent = handle.cancel() if how == "cancel" else handle.signal("go", {"v": 1})
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
    assert seqs == list(range(1, len(seqs) + 1)), [(e.seq, e.type) for e in by_id.values()]
    # the sink received exactly the events the run's committed workflow tasks emitted
    assert sorted(by_id) == sorted(e.id for e in committed)
    # the run ended as it ended, and says so everywhere
    last = [e.type for e in committed if e.type.startswith("run.")][-1]
    assert last == f"run.{info.status.value}" and info.status == got.status, (last, info, got)
