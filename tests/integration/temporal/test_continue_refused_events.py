"""The events a run hands the sink while a workflow task continues it as new, when Temporal
refuses that task's completion: every event reaches the sink with one sequence number, and
no two events share one (DESIGN §5, events).

How it went wrong (the differential fuzzer with ``WFE_FUZZ_CONTINUE_AS_NEW=1``, seed 120611:
about one run in two, ``[..., 25, 25, ...]``): a worker delivers a run's events *during* the
workflow task that emits them (``_outbox._hand_over``), and the task that records a run's
safe point also continues it as new. A signal that reaches Temporal while that task runs
makes the server refuse its completion (UnhandledCommand); the task runs again with the
signal in it, which its handler sees first. A stage that starts on a signal
(``after_signal``) had suspended on its gate in the refused task (``_gated``: its
stage.suspended, number k, reached the sink); in the task that ran again its signal was
there, so its activity ran instead, and the next event it emitted (its stage.completed) was
number k too. The sink held two events numbered k, one of which never happened.

Now (runs started with ``StartDocument.continue_carries_events``) the events of a task that
continues the run as new are not handed over in it: they ride in the new execution's start
document, whose first task hands them over; a refused task delivered nothing. The test
forces the refusal: the first time the run continues, the signal is sent (and accepted by
Temporal) before the task that continues completes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio import workflow

from driver_temporal._workflow import GraphWorkflow
from engine_port import MemorySink, Registry, RunStatus, StageContext, Workflow

from .conftest import EngineFactory
from .test_continue_as_new import In, refused_continues

pytestmark = pytest.mark.temporal


async def test_a_refused_continue_hands_no_event_numbered_again(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    wf = Workflow(f"can-refused-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return ctx.input.n

    @wf.stage(after=[a], signals=["go"], after_signal="go")
    async def b(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": 1})
    loop = asyncio.get_running_loop()
    forced: list[str] = []
    real = GraphWorkflow._continue

    def signal_first(self: GraphWorkflow) -> Any:
        # (on the workflow task's thread) the first continue of the run waits until the
        # run's gate signal reached Temporal: the server refuses this task's completion
        if not forced and not workflow.unsafe.is_replaying():
            forced.append(self._run_id)
            handle = engine._conn.get_workflow_handle(self._run_id)
            asyncio.run_coroutine_threadsafe(handle.signal("go", {"v": 1}), loop).result(30)
        return real(self)

    monkeypatch.setattr(GraphWorkflow, "_continue", signal_first)
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=120)
        refused = await refused_continues(engine, run.id)
        committed = await engine.events(run.id)
    assert info.status == RunStatus.COMPLETED, info
    assert info.output == {"v": 1}, info.output
    assert forced == [run.id] and refused, "no continue-as-new was refused: not the situation"
    by_id = {e.id: e for e in sink.events if e.run_id == run.id}
    seqs = sorted(e.seq for e in by_id.values())
    # before the fix: the gated stage.suspended and the stage.completed of the task that ran
    # again shared a number
    assert seqs == list(range(1, len(seqs) + 1)), [(e.seq, e.type) for e in by_id.values()]
    # the sink received exactly the events the run's committed workflow tasks emitted
    assert sorted(by_id) == sorted(e.id for e in committed)
