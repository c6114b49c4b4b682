"""S13 on Temporal for a run that has not ended: ``redrive(run, version="latest")`` re-pins a
stranded pending or suspended run in place (``driver_temporal._repin``), as the native driver
does: nothing re-run (the journaled step, the wait, the queued signal stay), ``redrive_count``
+ 1, one ``run.redriven`` (``from: last_failure``, the new version), and the new version's
worker finishes it. Before, the driver ended the execution and started one from the memo,
which lost the journal and the queued signals, so it refused such a run
(UnsupportedFeatureError)."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.worker import Replayer

from driver_temporal import TemporalEngine
from driver_temporal._history_events import replay_events
from driver_temporal._search import SA_VERSION
from driver_temporal._workflow import GraphWorkflow, workflow_runner
from engine_port import Lifecycle, MemorySink, Registry, RunStatus, StageContext, Workflow

from .conftest import EngineFactory, trace, wait_for_event
from .test_continue_as_new import executions
from .test_redrive_versions import pinned_to

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


def waiting(
    version: str, ran: Counter[str], wid: str = "repin-waits", extra: Sequence[str] = ()
) -> Workflow[In]:
    """Stage ``a`` journals step ``x`` and waits for ``go``; stage ``b`` waits for ``more``
    (and declares ``extra`` signals besides)."""
    wf = Workflow(wid, input=In, version=version)

    def x() -> str:
        ran[f"x@{version}"] += 1
        return f"x@{version}"

    @wf.stage(signals=["go"])
    async def a(ctx: StageContext[In]) -> str:
        ran[f"a@{version}"] += 1
        got = await ctx.step.run("x", x)
        go = await ctx.step.wait_for_signal("go", timeout=600)
        return f"{got}/a@{version}/{go['n']}"

    @wf.stage(after=[a], signals=["more", *extra])
    async def b(ctx: StageContext[In]) -> str:
        ran[f"b@{version}"] += 1
        more = await ctx.step.wait_for_signal("more", timeout=600)
        return f"{ctx.output_of('a')}/b@{version}/{more['n']}"

    return wf


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.05)


async def _start_memo(engine: TemporalEngine, run_id: str) -> dict[str, Any]:
    return await engine._start_memo(await engine._describe_raw(run_id))


async def test_a_suspended_run_is_repinned_in_place_keeping_its_journal_and_queued_signal(
    make_engine: EngineFactory, temporal_address: str
) -> None:
    """A v1 worker ran stage ``a`` until it waited for ``go`` (step ``x`` journaled), then
    went away; ``more``, for stage ``b``, was queued meanwhile. ``redrive(version="latest")``
    with v2 registered (no worker yet) re-pins the run where it is: still suspended, v2,
    redrive 1, ``x`` still listed, WfeVersion and the pin v2. A v2 worker then resumes ``a``
    with v2's body (``x`` from the journal) and ``b`` takes the queued ``more``; the events
    are the native driver's (ids of redrive 1 after the re-pin), and the history replays."""
    ran: Counter[str] = Counter()
    sink = MemorySink()
    e1 = make_engine(Registry([waiting("v1", ran)]), sink=sink)
    e2 = make_engine(Registry([waiting("v2", ran)]), sink=sink)
    async with e1, e2:
        async with e1.worker():
            run = await e1.start("repin-waits", {})
            await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        queued = await e2.signal(run.id, "more", {"n": 2})
        assert not queued.delivered
        moved = await e2.redrive(run.id, version="latest")
        assert (moved.id, moved.version, moved.status, moved.redrive_count) == (
            run.id,
            "v2",
            RunStatus.SUSPENDED,
            1,
        )
        assert [(s.id, s.status, s.waiting_for) for s in moved.stages] == [
            ("a", "suspended", "signal:go"),
            ("b", "pending", None),
        ]
        steps = {(s.stage, s.name): s.completed for s in await e2.steps(run.id)}
        assert steps == {("a", "x"): True, ("a", "go"): False}
        desc = await e2._conn.get_workflow_handle(run.id).describe()
        assert desc.typed_search_attributes.get(SA_VERSION) == "v2"
        dep = e2.task_queue("repin-waits").replace(".", "_")
        assert (await pinned_to(temporal_address, run.id))[2] == f"{dep}:v2"
        again = await e2.redrive(run.id, version="latest")  # already there: nothing to do
        assert (again.version, again.redrive_count) == ("v2", 1)
        async with e2.worker():
            await e2.signal(run.id, "go", {"n": 1})
            done = await e2.wait(run.id, timeout=60)
        await wait_for_event(sink, run.id, "run.completed", timeout=60)
        history = await e2._conn.get_workflow_handle(run.id).fetch_history()
    assert (done.status, done.output, done.version, done.redrive_count) == (
        RunStatus.COMPLETED,
        "x@v1/a@v2/1/b@v2/2",
        "v2",
        1,
    )
    assert ran == Counter({"a@v1": 1, "x@v1": 1, "a@v2": 1, "b@v2": 1})
    assert trace(sink, run) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("stage.suspended", "a"),
        ("run.redriven", None),
        ("stage.completed", "a"),
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("run.completed", None),
    ]
    events = {e.type: e for e in sink.for_run(run.id)}
    after = Lifecycle(run.id, 1)  # (as native: the events after a re-pin are redrive 1's)
    redriven = after.run_redriven("last_failure", "v2")
    assert (events["run.redriven"].id, events["run.redriven"].data) == (
        redriven.id,
        {"from": "last_failure", "redrive": 1, "version": "v2"},
    )
    assert events["run.completed"].id == after.run_completed().id
    assert events["run.created"].id == Lifecycle(run.id, 0).run_created("v1").id
    replayer = Replayer(workflows=[GraphWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, repr(result.replay_failure)
    replayed = [(e.seq, e.id, e.type) for e in await replay_events([history])]
    assert replayed == [(e.seq, e.id, e.type) for e in sink.for_run(run.id)]
    out = os.environ.get("WFE_RECORD_REPIN")
    if out:  # (``test_repin_replay``: the history this driver wrote, kept for later code)
        handed = [e.model_dump(mode="json") for e in sink.for_run(run.id)]
        data = {"workflow_id": run.id, "history": history.to_json_dict(), "events": handed}
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        await asyncio.to_thread(Path(out).write_text, text)


async def test_a_pending_signalled_run_is_repinned_with_its_signal(
    make_engine: EngineFactory,
) -> None:
    """A run that no v1 worker ever ran, sent ``go`` (queued in its history): before, its
    re-pin was refused (a restart would drop the signal); now v2 runs it and ``a`` takes the
    signal, ``run.redriven`` before the first ``stage.started``."""
    ran: Counter[str] = Counter()
    sink = MemorySink()
    e1 = make_engine(Registry([waiting("v1", ran)]), sink=sink)
    e2 = make_engine(Registry([waiting("v2", ran)]), sink=sink)
    async with e1, e2:
        run = await e1.start("repin-waits", {})
        await e1.signal(run.id, "go", {"n": 7})
        await e1.signal(run.id, "more", {"n": 8})
        moved = await e2.redrive(run.id, version="latest")
        assert (moved.version, moved.redrive_count) == ("v2", 1)
        # (pending; or, once the re-pin's task scheduled ``a`` for a v2 worker, running)
        assert moved.status in (RunStatus.PENDING, RunStatus.RUNNING)
        async with e2.worker():
            done = await e2.wait(run.id, timeout=60)
        await wait_for_event(sink, run.id, "run.completed", timeout=60)
    assert (done.status, done.output) == (RunStatus.COMPLETED, "x@v2/a@v2/7/b@v2/8")
    assert ran == Counter({"a@v2": 1, "x@v2": 1, "b@v2": 1})
    types = [t for t, _ in trace(sink, run)]
    assert types[:3] == ["run.created", "run.redriven", "run.started"]


async def test_a_repinned_run_continues_as_new_on_its_new_version(
    make_engine: EngineFactory,
) -> None:
    """A run that continues as new after its re-pin carries the new version, graph and
    redrive into the new execution (its start document), so it goes on on v2: ``b``, waiting
    in the continued execution, takes ``more`` with v2's body; nothing runs twice."""
    ran: Counter[str] = Counter()
    sink = MemorySink()
    opts = {"continue_as_new_events": 1}
    e1 = make_engine(Registry([waiting("v1", ran, "repin-cans")]), sink=sink, options=opts)
    e2 = make_engine(Registry([waiting("v2", ran, "repin-cans")]), sink=sink, options=opts)
    async with e1, e2:
        async with e1.worker():
            run = await e1.start("repin-cans", {})
            await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        await e2.redrive(run.id, version="latest")
        async with e2.worker():
            await e2.signal(run.id, "go", {"n": 1})

            async def b_waits() -> bool:
                events = sink.for_run(run.id)
                return any(e.type == "stage.suspended" and e.stage == "b" for e in events)

            async def continued_on_v2() -> bool:
                start = await _start_memo(e2, run.id)
                return bool(start.get("continued")) and start.get("version") == "v2"

            await until(b_waits, "b waits for more")
            await until(continued_on_v2, "the run continued as new on v2")
            start = await _start_memo(e2, run.id)
            assert (start["version"], start["redrive"]) == ("v2", 1)
            await e2.signal(run.id, "more", {"n": 2})
            done = await e2.wait(run.id, timeout=60)
        assert len(await executions(e2, run.id)) >= 2
    assert (done.status, done.output, done.version) == (
        RunStatus.COMPLETED,
        "x@v1/a@v2/1/b@v2/2",
        "v2",
    )
    # (b's body ran twice: the try that suspended, and the one that resumed)
    assert ran == Counter({"a@v1": 1, "x@v1": 1, "a@v2": 1, "b@v2": 2})


async def test_a_run_whose_old_worker_is_still_up_is_repinned_in_place(
    make_engine: EngineFactory,
) -> None:
    """A run re-pinned while a worker of its version still runs (it holds the run in its
    cache, on its sticky queue): the re-pin moves it all the same, and the v2 worker, not
    the v1 one, runs what follows."""
    ran: Counter[str] = Counter()
    sink = MemorySink()
    e1 = make_engine(Registry([waiting("v1", ran)]), sink=sink)
    e2 = make_engine(Registry([waiting("v2", ran)]), sink=sink)
    async with e1, e2, e1.worker(), e2.worker():
        run = await e1.start("repin-waits", {})
        await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        moved = await e2.redrive(run.id, version="latest")
        assert (moved.version, moved.status, moved.redrive_count) == (
            "v2",
            RunStatus.SUSPENDED,
            1,
        )
        await e2.signal(run.id, "more", {"n": 2})  # (queued: b takes it when it starts)
        await e2.signal(run.id, "go", {"n": 1})
        done = await e2.wait(run.id, timeout=60)
    assert (done.status, done.output) == (RunStatus.COMPLETED, "x@v1/a@v2/1/b@v2/2")
    assert ran == Counter({"a@v1": 1, "x@v1": 1, "a@v2": 1, "b@v2": 1})


async def test_a_repinned_run_takes_the_signals_its_new_version_declares(
    make_engine: EngineFactory,
) -> None:
    """v2 declares a signal v1 did not (same stages and dependencies). After the re-pin,
    ``signal`` through an engine that serves neither version (``wfe signal`` without --app:
    the run's graph read from Temporal and the BlobStore) accepts it, and so does the run
    for an operator's raw signal of that name; before, the graph read was the one the
    execution started with (v1's), and the signal was refused as undeclared."""
    ran: Counter[str] = Counter()
    sink = MemorySink()
    e1 = make_engine(Registry([waiting("v1", ran)]), sink=sink)
    e2 = make_engine(Registry([waiting("v2", ran, extra=["extra"])]), sink=sink)
    bare = make_engine(Registry([]), sink=sink)
    async with e1, e2, bare:
        run = await e1.start("repin-waits", {})  # no v1 worker: pending
        moved = await e2.redrive(run.id, version="latest")
        assert moved.version == "v2"
        queued = await bare.signal(run.id, "extra", {"n": 3})
        assert not queued.delivered
        handle = e2._conn.get_workflow_handle(run.id)
        await handle.signal("extra", {"n": 4})  # (an operator's, by its declared name)
        async with e2.worker():
            await e2.signal(run.id, "go", {"n": 1})
            await e2.signal(run.id, "more", {"n": 2})
            done = await e2.wait(run.id, timeout=60)
        memo = await (await handle.describe()).memo()
    assert (done.status, done.output) == (RunStatus.COMPLETED, "x@v2/a@v2/1/b@v2/2")
    assert "wfe_rejected_signals" not in memo


async def test_a_re_pin_that_cannot_move_the_pin_lifts_its_hold(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pin move fails (Temporal unavailable at that moment): redrive raises, the run's
    hold is lifted (step 1 undone) and it is where it was: v1, redrive 0, and a v1 worker
    finishes it; a redrive later re-pins as usual."""
    from driver_temporal import _repinning
    from engine_port.errors import DriverUnavailableError

    ran: Counter[str] = Counter()
    sink = MemorySink()
    e1 = make_engine(Registry([waiting("v1", ran)]), sink=sink)
    e2 = make_engine(Registry([waiting("v2", ran)]), sink=sink)
    moved_pin = _repinning._move_pin

    async def unavailable(*args: Any) -> None:
        raise DriverUnavailableError("Temporal is away (test)")

    async with e1, e2:
        run = await e1.start("repin-waits", {})
        monkeypatch.setattr(_repinning, "_move_pin", unavailable)
        with pytest.raises(DriverUnavailableError):
            await e2.redrive(run.id, version="latest")
        kept = await e2.get_run(run.id)
        assert (kept.version, kept.redrive_count) == ("v1", 0)
        monkeypatch.setattr(_repinning, "_move_pin", moved_pin)
        async with e1.worker():
            await e1.signal(run.id, "go", {"n": 1})

            async def b_waits() -> bool:
                events = sink.for_run(run.id)
                return any(e.type == "stage.suspended" and e.stage == "b" for e in events)

            await until(b_waits, "b waits for more")
            moved = await e2.redrive(run.id, version="latest")
            assert (moved.version, moved.redrive_count) == ("v2", 1)
        async with e2.worker():
            await e2.signal(run.id, "more", {"n": 2})
            done = await e2.wait(run.id, timeout=60)
    assert (done.status, done.output) == (RunStatus.COMPLETED, "x@v1/a@v1/1/b@v2/2")
    assert "run.redriven" in [t for t, _ in trace(sink, run)]
