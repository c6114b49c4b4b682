"""The answer ``engine.signal`` gives for a signal to a stage that visibly waits for it, on a
run that continues as new at every wait (``continue_as_new_events=1``): ``delivered=True``,
as on the native driver (DESIGN §5), and the stage gets the signal exactly once.

How it went wrong (the differential fuzzer saw it in about 1 case in 25-50): the workflow task
that records a suspension also continues the run as new. A signal that reaches Temporal while
that task runs makes the server refuse the task's completion (a continue-as-new with an
unhandled signal: UnhandledCommand), and the task runs again with the signal in it, in the
same activation as the activity result that suspended the stage. temporalio hands an
activation's signals to their handlers before it resumes the coroutines that wait on its
activity results, so the signal handler saw the stage still running and answered "buffered"
(the stage then took the signal from the queue at once). The sink had already received the
stage.suspended event (a worker delivers a run's events during the workflow task, before its
completion), so a sender reacting to it signalled a stage that was visibly waiting. The fix:
a signal answered buffered while a stage activity is in flight becomes delivered when a wait
resumes for it in the same activation (``SignalHandlers._answer``), and the engine hears what
the activation decided last, once it ended (``_waiters.AnswersAfterActivation``).

The sink below holds each first delivery of a stage.suspended event for ``HOLD_S`` (as a slow
sink does), so the signal, sent the moment the event arrives, reaches Temporal while the task
still runs: every wait of the run is in that situation (before the fix: 6 answers of 6
buffered, every run), not one in 25-50.

The same with a ``local=True`` stage (``..._local_stage_...``): the stage's local activity
runs again in the task that runs again (its result was not recorded: the refused task was to
record it), after the signal handler, and reads back the suspension its first run journaled
(``_activities._Recorded``); its wait then resumes for the signal at once. The signal came
with the task that scheduled the try (the run's first task, or the task that resumed the
stage) or while it ran (a try scheduled in a task the history holds, replayed), and the
engine heard "buffered" before the try's result came, in an activation of its own (before
the fix: 3 answers of 6 buffered, every run). Now such a wait delivers the answers given from
the try's scheduling on (``SignalHandlers._local_window``, ``_delivered_late``), which the
engine hears only once the try's result came. A signal buffered before the local stage
started (``..._stays_buffered``) is lent to its try, which takes it without suspending: it
stays buffered, while a later one in the situation above is delivered.

Since ``StartDocument.continue_carries_events`` (test_continue_refused_events.py) the events
of a task that continues the run as new reach the sink only from the new execution's first
task, once the continue was accepted: a sender reacting to them no longer races a refused
continue, so these runs see none (they did, every run, before); the rule above still answers
a signal that reaches a refused continue otherwise.

``histories/continue_signal_answer.json`` is the first test's run recorded on the code before
the fix (commit 0740025: six refused continues, six signals answered buffered), and
``histories/continue_signal_answer_local.json`` the local one's (commit fed4b88); they replay
on the current code (the fixes change no command, so runs need no start document mark).
Record them again with ``WFE_RECORD_CONTINUE_ANSWER=<file> pytest <the test>`` on the code to
record.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from driver_temporal import _rpc
from driver_temporal._workflow import GraphWorkflow, workflow_runner
from engine_port import (
    Event,
    MemorySink,
    Registry,
    RunInfo,
    RunStatus,
    SignalResult,
    StageContext,
    Workflow,
)

from .conftest import EngineFactory
from .test_continue_as_new import Calls, In, executions, refused_continues, refused_in

pytestmark = pytest.mark.temporal

WAITS = 6
HOLD_S = 0.25  # under the worker's 0.5 s hand-over bound (``_run_end._HAND_WITHIN_S``)
HISTORIES = Path(__file__).parent / "histories"
HISTORY = HISTORIES / "continue_signal_answer.json"
HISTORY_LOCAL = HISTORIES / "continue_signal_answer_local.json"


class SlowSink(MemorySink):
    """A sink that tells the test of each stage.suspended it receives (once per event id: a
    workflow task run again hands its events again), then takes ``HOLD_S`` to acknowledge
    it."""

    def __init__(self) -> None:
        super().__init__()
        self.suspended: asyncio.Queue[Event] = asyncio.Queue()
        self._seen: set[str] = set()

    async def publish(self, events: Sequence[Event]) -> None:
        await super().publish(events)
        held = [e for e in events if e.type == "stage.suspended" and e.id not in self._seen]
        for e in held:
            self._seen.add(e.id)
            self.suspended.put_nowait(e)
        if held:
            await asyncio.sleep(HOLD_S)


def waiting_workflow(calls: Calls, *, local: bool = False) -> Workflow[In]:
    wf = Workflow(f"can-answer-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage(signals=["go"], local=local)
    async def s(ctx: StageContext[In]) -> list[int]:
        calls.hit("s")
        got = []
        for _ in range(WAITS):
            payload = await ctx.step.wait_for_signal("go", timeout=600)
            got.append(int(payload["v"]))
        return got

    return wf


async def _answers(make_engine: EngineFactory, *, local: bool) -> tuple[RunInfo, list[bool], int]:
    """Run the waiting workflow, signalling each wait as soon as its stage.suspended reached
    the slow sink: the run's end, the answers, and how many continues the server refused
    (in any execution of the run)."""
    calls = Calls()
    wf = waiting_workflow(calls, local=local)
    sink = SlowSink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": 1})
    answers: list[bool] = []
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            for i in range(WAITS):
                event = await asyncio.wait_for(sink.suspended.get(), 60)
                assert event.stage == "s" and event.data.get("waiting_for") == "signal:go", event
                res = await engine.signal(run.id, "go", {"v": i})
                assert not res.already_completed, res
                answers.append(res.delivered)
            info = await engine.wait(run.id, timeout=120)
        refused = 0
        kept = await executions(engine, run.id)
        recorded = None  # (the last execution with a refused continue)
        for ex in kept:
            handle = engine._conn.get_workflow_handle(run.id, run_id=ex.run_id)
            history = await handle.fetch_history()
            seen = refused_in(history)
            refused += seen
            recorded = history if seen else recorded
        if os.environ.get("WFE_RECORD_CONTINUE_ANSWER") and recorded is not None:
            data = {"workflow_id": run.id, "history": json.loads(recorded.to_json())}
            out = Path(os.environ["WFE_RECORD_CONTINUE_ANSWER"])
            out.write_text(json.dumps(data))  # noqa: ASYNC240 (a recording, on request)
    assert info.status == RunStatus.COMPLETED, info
    # each signal reached the stage once, in order
    assert info.output == list(range(WAITS)), info.output
    # a refused continue is not tried again (the wait resumed in the task that ran again)
    assert len(kept) + refused >= WAITS, (len(kept), refused)
    return info, answers, refused


async def test_a_signal_to_a_visibly_waiting_stage_is_delivered_across_continue_as_new(
    make_engine: EngineFactory,
) -> None:
    _, answers, refused = await _answers(make_engine, local=False)
    # the situation: the server refused the continue of (at least) the first wait
    # (runs with ``continue_carries_events``) the stage.suspended a sender reacts to reaches
    # the sink only once the continue that followed it was accepted: the signal no longer
    # races a refused continue (the recorded histories below keep that path replayed)
    assert not refused, refused
    assert answers == [True] * WAITS, answers


async def test_a_signal_to_a_visibly_waiting_local_stage_is_delivered_across_continue_as_new(
    make_engine: EngineFactory,
) -> None:
    _, answers, refused = await _answers(make_engine, local=True)
    # (runs with ``continue_carries_events``) the stage.suspended a sender reacts to reaches
    # the sink only once the continue that followed it was accepted: the signal no longer
    # races a refused continue (the recorded histories below keep that path replayed)
    assert not refused, refused
    assert answers == [True] * WAITS, answers


@pytest.mark.parametrize("recorded", [HISTORY, HISTORY_LOCAL], ids=["activity", "local"])
async def test_the_run_recorded_before_the_fix_replays(recorded: Path) -> None:
    """The recorded runs (buffered answers, on the code before the fix) replay unchanged."""
    data = json.loads(recorded.read_text())  # noqa: ASYNC240 (a small recording)
    history = WorkflowHistory.from_json(data["workflow_id"], data["history"])
    replayer = Replayer(workflows=[GraphWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, repr(result.replay_failure)


async def test_a_signal_buffered_before_a_local_stage_started_stays_buffered(
    make_engine: EngineFactory,
) -> None:
    """The rule does not deliver a signal that was really buffered: the first signal reaches
    the run while the stage before the local one runs (no wait for it: buffered, as on the
    native driver), and the local stage's first wait takes it without suspending; the second
    is sent once the second wait's stage.suspended reached the slow sink, while the task that
    recorded it continues the run as new (refused: the task runs again, the local try read
    back). Before the fix: [False, False]."""
    running, release = asyncio.Event(), asyncio.Event()
    wf = Workflow(f"can-answer-early-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        running.set()
        await release.wait()
        return ctx.input.n

    @wf.stage(after=[a], signals=["go"], local=True)
    async def s(ctx: StageContext[In]) -> list[int]:
        got = []
        for _ in range(2):
            payload = await ctx.step.wait_for_signal("go", timeout=600)
            got.append(int(payload["v"]))
        return got

    sink = SlowSink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": 1})
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            await asyncio.wait_for(running.wait(), 60)
            early = await engine.signal(run.id, "go", {"v": 0})
            release.set()
            event = await asyncio.wait_for(sink.suspended.get(), 60)
            assert event.stage == "s" and event.data.get("waiting_for") == "signal:go", event
            late = await engine.signal(run.id, "go", {"v": 1})
            info = await engine.wait(run.id, timeout=120)
        refused = await refused_continues(engine, run.id)
    assert info.status == RunStatus.COMPLETED, info
    assert info.output == [0, 1], info.output
    # the first wait never suspended: the sink saw one suspension (its id once or again)
    suspensions = [e for e in sink.events if e.run_id == run.id and e.type == "stage.suspended"]
    assert len({e.id for e in suspensions}) == 1, suspensions
    # (runs with ``continue_carries_events``) the stage.suspended a sender reacts to reaches
    # the sink only once the continue that followed it was accepted: the signal no longer
    # races a refused continue (the recorded histories below keep that path replayed)
    assert not refused, refused
    assert (early.delivered, late.delivered) == (False, True), (early, late)


@pytest.mark.parametrize("local", [False, True], ids=["activity", "local"])
async def test_a_signal_that_reaches_a_refused_continue_is_delivered(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, local: bool
) -> None:
    """The situation above, forced (a sender no longer reaches it by reacting to the sink,
    but a signal sent at that moment for any other reason still does): the first time the run
    continues as new, in the workflow task that recorded its stage's suspension, an
    ``engine.signal`` is sent and the task goes on only once Temporal took the signal, so the
    server refuses the continue, every run. The stage visibly waits (as on native):
    ``delivered``. Before a779dcf (activity) and 45f8f6f (local): buffered."""
    wf = Workflow(f"can-answer-forced-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage(signals=["go"], local=local)
    async def s(ctx: StageContext[In]) -> int:
        payload = await ctx.step.wait_for_signal("go", timeout=600)
        return int(payload["v"])

    engine = make_engine(Registry([wf]), options={"continue_as_new_events": 1})
    loop = asyncio.get_running_loop()
    taken = asyncio.Event()
    real_call = _rpc.call

    async def call(what: str, *a: Any, **k: Any) -> Any:
        out = await real_call(what, *a, **k)
        if what.startswith("signalling run"):
            taken.set()  # (Temporal took the signal)
        return out

    monkeypatch.setattr(_rpc, "call", call)
    sent: list[concurrent.futures.Future[SignalResult]] = []
    real_continue = GraphWorkflow._continue

    def signal_first(self: GraphWorkflow) -> Any:
        # (on the workflow task's thread: short, under the SDK's 2 s deadlock bound)
        if not sent and not workflow.unsafe.is_replaying():
            sent.append(
                asyncio.run_coroutine_threadsafe(engine.signal(self._run_id, "go", {"v": 7}), loop)
            )
            asyncio.run_coroutine_threadsafe(taken.wait(), loop).result(30)
        return real_continue(self)

    monkeypatch.setattr(GraphWorkflow, "_continue", signal_first)
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=120)
            assert sent, "the run never continued as new"
            res = await asyncio.wait_for(asyncio.wrap_future(sent[0]), 60)
        refused = await refused_continues(engine, run.id)
    assert info.status == RunStatus.COMPLETED and info.output == 7, info
    assert refused, "no continue-as-new was refused: the test did not reach the situation"
    assert res.delivered and not res.already_completed, res
