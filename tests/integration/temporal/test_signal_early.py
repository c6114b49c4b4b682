"""Signals to a run before its first workflow task, or while no worker runs it: the bound
(``max_pending_signals``) holds and ``signal()`` answers typed, as on native.

A run's first execution handles the signals of its first task before ``run`` set up; they
were queued unjudged, and ``signal()`` answered a keyless one to a pending run "buffered"
without asking it, so a burst to a just-started run held more than the bound. Now the first
task judges them (runs started with ``StartDocument.bounds_first``) and ``signal()`` reads
their fate from the history while no task started (``_early``), or asks the run. (The burst
before any worker, answer by answer as on native: ``conformance._signals``.)"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from driver_temporal._signals import SignalHandlers
from driver_temporal._start import StartDocument
from engine_port import MemorySink, Registry, RunStatus, SignalResult, StageContext, Workflow
from engine_port.errors import SignalQueueFullError, StepTimeoutError

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    pass


async def test_a_burst_while_the_worker_starts_is_bounded(make_engine: EngineFactory) -> None:
    """A run started with no worker; five keyless signals sent at once while its worker
    starts (the run pending: its first workflow task not started, or running, or done) to
    a run bounded at 3: three are queued, two raise SignalQueueFullError, and the stage
    takes exactly the three. (Before: a pending run's signal was answered buffered without
    asking it and its first task queued them all: the run held 5 of 3.)"""
    released = asyncio.Event()
    wf = Workflow("early-burst", input=In)

    @wf.stage(signals=["go"])
    async def w(ctx: StageContext[In]) -> list[Any]:
        # (a poll, not a signal wait: nothing is taken until the test released it)
        await ctx.step.wait_for(
            "released", lambda: released.is_set() or None, interval=0.05, timeout=120
        )
        got: list[Any] = []
        try:
            for _ in range(6):
                got.append(await ctx.step.wait_for_signal("go", timeout=timedelta(seconds=1)))
        except StepTimeoutError:
            pass
        return got

    engine = make_engine(Registry([wf]), max_pending_signals=3)
    async with engine:
        run = await engine.start("early-burst", {})

        async def send(i: int) -> Any:
            try:
                res = await engine.signal(run.id, "go", i)
            except SignalQueueFullError as exc:
                assert "holds 3 signals" in str(exc), exc
                return None
            return i, res.already_completed

        burst = asyncio.ensure_future(asyncio.gather(*(send(i) for i in range(5))))
        try:
            async with engine.worker():  # (starts while the burst is sent)
                answers = await asyncio.wait_for(burst, 60)
                queued = [a for a in answers if a is not None]
                assert len(queued) == 3, answers
                assert all(not done for _, done in queued), answers
                released.set()
                info = await engine.wait(run.id, timeout=90)
        finally:
            burst.cancel()
    assert info.status == RunStatus.COMPLETED, info
    assert sorted(info.output) == sorted(i for i, _ in queued), (info.output, answers)


async def test_no_worker_answers_typed_within_signal_timeout(make_engine: EngineFactory) -> None:
    """A started run whose worker is gone: ``signal()`` waits ``signal_timeout`` for the run,
    then answers what the run's next workflow task will make of the signal, run here on its
    history (a SignalResult, no temporalio error), each within about ``signal_timeout`` (the
    query and the update once took it each, and a query's own timeout ran 2-3 times over).
    The answers are the native driver's: a retry of a key the run already has is
    already_completed, a signal the waiting stage takes delivered, the next one buffered.
    (Before, with no worker, they were read from the run's last published state: a retried
    key was not reported already_completed, nothing there knowing the run's keys.) The
    stage gets each signal once when a worker is back."""
    wf = Workflow("early-idle", input=In)

    @wf.stage(signals=["go"])
    async def w(ctx: StageContext[In]) -> list[Any]:
        return [await ctx.step.wait_for_signal("go") for _ in range(3)]

    sink = MemorySink()
    timeout_s = 3.0
    engine = make_engine(
        Registry([wf]), sink=sink, max_pending_signals=5, options={"signal_timeout": timeout_s}
    )
    async with engine:
        run = await engine.start("early-idle", {})
        async with engine.worker():
            await wait_for_event(sink, run.id, "stage.suspended")
            first = await engine.signal(run.id, "go", 0, idempotency_key="k0")
            assert (first.delivered, first.already_completed) == (True, False), first
            await _suspended_twice(sink, run.id)  # (waits for the second signal now)
        answers: list[tuple[SignalResult, float]] = []
        for value, key in [(0, "k0"), (1, "k1"), (0, "k0"), (2, None)]:
            t0 = time.monotonic()
            res = await engine.signal(run.id, "go", value, idempotency_key=key)
            answers.append((res, time.monotonic() - t0))
        got = [(res.delivered, res.already_completed) for res, _ in answers]
        assert got == [(False, True), (True, False), (False, True), (False, False)], answers
        for res, took in answers:
            assert isinstance(res, SignalResult), res
            # (the answer waits for the run signal_timeout, then runs its next task)
            assert timeout_s * 0.9 <= took < timeout_s + 2.5, answers
        async with engine.worker():
            info = await engine.wait(run.id, timeout=90)
    assert info.status == RunStatus.COMPLETED, info
    assert info.output == [0, 1, 2]


async def _suspended_twice(sink: MemorySink, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while sum(e.type == "stage.suspended" for e in sink.for_run(run_id)) < 2:
        assert time.monotonic() < deadline, sink.for_run(run_id)
        await asyncio.sleep(0.05)


class _Handlers(SignalHandlers):
    """The signal queue alone, outside a workflow (no stage waits; refusals recorded)."""

    def __init__(self) -> None:
        self._run_id = "r"
        self._signals, self._signal_keys, self._deliveries = [], set(), {}
        self._early, self._lent, self._reserved = [], {}, {}
        self.refused: list[tuple[str, str]] = []

    def _reject(self, name: str, why: str) -> None:
        self.refused.append((name, why))

    def _decided(self, delivery: str, res: dict[str, Any]) -> None:
        self._deliveries[delivery] = res


@pytest.mark.parametrize("bounds_first", [False, True])
def test_first_task_signals_are_bounded_only_on_runs_started_with_the_rule(
    bounds_first: bool,
) -> None:
    """Replay safety: a run started before the rule (no ``bounds_first`` in its start
    document) queues every signal of its first task, as its history recorded; one started
    with it refuses those past the bound, a sender's retry still answered."""
    q = _Handlers()
    sent = [("go", "k0"), ("go", None), ("go", "k0"), ("go", None), ("go", "k3")]
    for i, (name, key) in enumerate(sent):
        q._arrived(name, {"v": i}, f"d{i}", key, bounded=True)
    doc = StartDocument(
        run_id="r",
        workflow_id="w",
        version="v1",
        graph={},
        max_pending_signals=2,
        bounds_first=bounds_first,
    )
    q._start = doc
    q._carry_signals(doc)
    assert q._deliveries["d2"] == {"delivered": False, "already_completed": True}
    if bounds_first:
        assert [s["payload"]["v"] for s in q._signals] == [0, 1]
        assert q._deliveries["d3"] == {"rejected": "SignalQueueFullError", "bound": 2}
        assert q.refused == [("go", "SignalQueueFullError")] * 2
    else:
        assert [s["payload"]["v"] for s in q._signals] == [0, 1, 3, 4]
        assert q.refused == []


def test_new_runs_carry_the_rule() -> None:
    """``for_engine`` (start, redrive, import) marks the run, so its first task judges."""
    from engine_port import EngineSettings

    doc = StartDocument.for_engine(
        EngineSettings(driver="temporal"),
        10.0,
        run_id="r",
        workflow_id="w",
        version="v1",
        graph={},
    )
    assert doc.bounds_first
    assert doc.memo().get("bounds_first") is True
