"""The bound on queued signals (``max_pending_signals``) across a continue-as-new: signals
sent in the gap of a continue reach the new execution's first workflow task before its
state (the queue carried over) is set up (``SignalHandlers._early``); they are judged
against the bound once it is, so the run never holds more than the bound, as on native."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from driver_temporal._signals import SignalHandlers
from driver_temporal._start import StartDocument
from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)
from engine_port.errors import SignalQueueFullError

from .conftest import EngineFactory
from .test_continue_as_new import Calls, In
from .test_continue_as_new_gap import STAGGER_S, _check_events, _ns, across_the_gap, burst_in_order
from .test_continue_as_new_more import ONCE

pytestmark = pytest.mark.temporal

BOUND = 3
FULL = "SignalQueueFullError"


def bound_workflow(calls: Calls) -> Workflow[In]:
    """s: waits for ``pre``, then for ``go`` three times."""
    wf = Workflow(f"bound-gap-{_ns()}", input=In, version="v1")

    @wf.stage(signals=["pre", "go"])
    async def s(ctx: StageContext[In]) -> dict[str, Any]:
        calls.hit("s")
        pre = await ctx.step.wait_for_signal("pre", timeout=600)
        got = [(await ctx.step.wait_for_signal("go", timeout=600))["v"] for _ in range(3)]
        return {"pre": pre["v"], "go": got}

    return wf


# go 0 (k0) and go 1 (k1) are queued before s waits (carried over by the continue); then,
# once s waits for ``pre`` (on Temporal: in the gap of the continue), these:
BURST = [
    ("pre", "p", None),  # taken by the waiting step at once, but it counts: 3 of 3
    ("go", 2, "k2"),  # the queue is full
    ("go", 0, "k0"),  # a sender's retry of a queued signal at the bound
    ("go", 3, None),  # still full
]
WANT_RESULTS: list[Any] = [(True, False), FULL, (False, True), FULL]
WANT_OUTPUT = {"pre": "p", "go": [0, 1, 2]}


async def _send_burst(engine: Any, run_id: str) -> list[Any]:
    async def send(i: int, name: str, v: Any, key: str | None) -> Any:
        await asyncio.sleep(i * STAGGER_S)
        try:
            res = await engine.signal(run_id, name, {"v": v}, idempotency_key=key)
        except SignalQueueFullError:
            return FULL
        return res.delivered, res.already_completed

    return list(await asyncio.gather(*(send(i, *sent) for i, sent in enumerate(BURST))))


async def _retry_when_drained(engine: Any, run_id: str) -> tuple[bool, bool]:
    """go 2 (k2) again, until the run took enough to have room: the refused k2 left no trace,
    so it is queued now (not already_completed) and taken by the last wait."""
    for _ in range(400):
        try:
            res = await engine.signal(run_id, "go", {"v": 2}, idempotency_key="k2")
        except SignalQueueFullError:
            await asyncio.sleep(0.05)
            continue
        return res.delivered, res.already_completed
    raise AssertionError("the queue never drained")


async def _bound_run(engine: Any, sink: MemorySink, wf: Workflow[In], temporal: bool) -> Any:
    _, results, again, done, events = await across_the_gap(
        engine, sink, wf, temporal, (0, 1), _send_burst, _retry_when_drained
    )
    return results, again, done, events


async def test_a_burst_in_the_gap_of_a_continue_is_bounded(
    make_engine: EngineFactory, tmp_path: Path, blob_dir: Path
) -> None:
    """A run holding 2 of ``max_pending_signals=3`` continues as new; in the gap, ``pre``
    (for the waiting step) is queued (3 of 3), ``go`` k2 and a keyless ``go`` are refused
    (SignalQueueFullError), a retry of k0 is already_completed; once the run took some, k2
    is queued (the refusal left nothing behind). As on native. (Before, the gap's signals
    were judged against the queue before the carried one was loaded: an empty one, so all
    were queued and the run held 5 signals of 3.)"""
    wf = bound_workflow(Calls())
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options=dict(ONCE), max_pending_signals=BOUND)
    async with engine:
        results, again, done, events = await _bound_run(engine, sink, wf, temporal=True)
        await burst_in_order(engine, done.id, [name for name, _, _ in BURST])
    assert results == WANT_RESULTS, results
    assert again[1] is False, again
    assert done.status == RunStatus.COMPLETED, done
    assert done.output == WANT_OUTPUT, done.output
    _check_events(events)

    nwf = bound_workflow(Calls())
    nsink = MemorySink()
    native: Any = create_engine(
        EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / 'n.db'}",
            blob_url=f"file://{blob_dir}",
            max_pending_signals=BOUND,
        ),
        Registry([nwf]),
        event_sink=nsink,
    )
    async with native:
        nresults, nagain, ndone, _ = await _bound_run(native, nsink, nwf, temporal=False)
    assert nresults == WANT_RESULTS, nresults
    assert nagain[1] is False, nagain
    assert ndone.output == WANT_OUTPUT, ndone.output


class _Handlers(SignalHandlers):
    """The signal queue alone, outside a workflow (no stage waits; refusals recorded)."""

    def __init__(self) -> None:
        self._run_id = "r"
        self._signals, self._signal_keys, self._deliveries = [], set(), {}
        self._early, self._lent = [], {}
        self.refused: list[tuple[str, str]] = []

    def _reject(self, name: str, why: str) -> None:
        self.refused.append((name, why))

    def _decided(self, delivery: str, res: dict[str, Any]) -> None:
        self._deliveries[delivery] = res


@pytest.mark.parametrize("bounds_early", [False, True])
def test_early_signals_are_bounded_only_on_executions_continued_with_the_rule(
    bounds_early: bool,
) -> None:
    """Replay safety: an execution continued by a driver before the rule (no
    ``bounds_early`` in its start document) queues every early signal, as its history
    recorded; one continued with it refuses those past the bound, a repeat still answered."""
    q = _Handlers()
    for i, (name, key) in enumerate([("go", "k2"), ("go", "k0"), ("go", None)]):
        q._arrived(name, {"v": i}, f"d{i}", key, bounded=True)
    doc = StartDocument(
        run_id="r",
        workflow_id="w",
        version="v1",
        graph={},
        max_pending_signals=2,
        continued=True,
        signals=[{"name": "go", "payload": 0, "idempotency_key": "k0"}],
        bounds_early=bounds_early,
    )
    q._carry_signals(doc)
    if bounds_early:
        assert [s["idempotency_key"] for s in q._signals] == ["k0", "k2"]
        assert q._deliveries["d1"] == {"delivered": False, "already_completed": True}
        assert q._deliveries["d2"] == {"rejected": "SignalQueueFullError"}
        assert q.refused == [("go", "SignalQueueFullError")]
    else:
        assert [s["idempotency_key"] for s in q._signals] == ["k0", "k2", None]
        assert q.refused == []
