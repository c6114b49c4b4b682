"""Continue-as-new (``GraphWorkflow._continue``) seen from outside, where it meets the rest
of the run: a stage timeout and retry backoffs of a stage that suspends (the run continues
in its waits), a cancel right around a continue, and a parallel group in flight while the
run is past its threshold (signals sent in the gap of a continue:
``test_continue_as_new_gap``). Each run is compared with the same run that never continued
(at the default threshold) and, where timing allows, with the native driver."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conformance._trace import normalise
from engine_port import (
    EngineSettings,
    Event,
    MemorySink,
    Registry,
    Retry,
    RunInfo,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)

from .conftest import EngineFactory
from .test_continue_as_new import Calls, In, executions, until
from .test_continue_as_new_gap import _check_events, _ns, _went_on
from .test_continue_as_new_more import ONCE, _both

pytestmark = pytest.mark.temporal


def _at(events: list[Event], type_: str, stage: str | None = None) -> list[datetime]:
    return [e.at for e in events if e.type == type_ and (stage is None or e.stage == stage)]


# -- 1. a stage timeout and retry backoffs around continues -------------------------------------
TIMEOUT_S = 0.6
INITIAL_S = 0.6
# attempt 1 naps in the first execution, when it is younger than a second: the run continued
# in that nap, and the new execution resumed it with ~0 s left (now it waits until the nap
# ended: a wait the run continues in has ~1.5 s left, 2.5 s in so young an execution);
# attempt 3 naps in a later execution, long enough for the run to continue in the nap
NAP_S = {1: 1.2, 3: 2.0}


def retry_workflow(calls: Calls) -> Workflow[In]:
    """r: attempt 1 naps (the run continues in the nap), then outlives its stage timeout;
    attempt 2 fails at once; attempt 3 naps again (another continue), then completes.
    Before, the continued run's timeout and both backoffs came ~1.2 s late: the new
    execution set the nap's timer again with ~0 s left, which fired a second later."""
    wf = Workflow(f"can-retry-{_ns()}", input=In, version="v1")

    @wf.stage(
        retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=INITIAL_S), backoff=2.0),
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    async def r(ctx: StageContext[In]) -> int:
        calls.hit(f"body:{ctx.attempt}")
        await ctx.step.run(f"before-{ctx.attempt}", lambda: calls.hit("before"))
        if ctx.attempt in NAP_S:
            await ctx.step.sleep(f"nap-{ctx.attempt}", NAP_S[ctx.attempt])
        if ctx.attempt == 1:
            calls.hit("hang")
            await asyncio.sleep(TIMEOUT_S * 5)
        if ctx.attempt == 2:
            raise RuntimeError("attempt 2 fails")
        return ctx.attempt

    return wf


def _attempts(events: list[Event]) -> list[tuple[str, Any, Any]]:
    return [
        (e.type, e.data.get("attempt"), e.data.get("will_retry"))
        for e in events
        if e.type in ("stage.started", "stage.failed", "stage.completed")
    ]


async def test_stage_timeout_and_retry_backoff_across_continues(
    make_engine: EngineFactory, tmp_path: Path, blob_dir: Path
) -> None:
    async def on_temporal(options: dict[str, Any]) -> tuple[RunInfo, list[Event], Calls, int]:
        calls = Calls()
        wf = retry_workflow(calls)
        engine = make_engine(Registry([wf]), task_queue=f"retry-{_ns()}", options=dict(options))
        async with engine:
            run = await engine.start(wf, {"n": 1})
            async with engine.worker():
                info = await engine.wait(run.id, timeout=60)
            found = await executions(engine, run.id)
            return info, await engine.events(run.id), calls, len(found)

    async def on_native() -> tuple[RunInfo, list[Event], Calls, int]:
        calls = Calls()
        wf = retry_workflow(calls)
        native: Any = create_engine(
            EngineSettings(
                driver="native",
                database_url=f"sqlite:///{tmp_path / 'n.db'}",
                blob_url=f"file://{blob_dir}",
            ),
            Registry([wf]),
        )
        async with native:
            run = await native.start(wf, {"n": 1})
            async with native.worker():
                info = await native.wait(run.id, timeout=60)
            return info, await native.events(run.id), calls, 0

    async with asyncio.TaskGroup() as group:
        runs = [group.create_task(c) for c in (on_temporal({}), on_temporal(ONCE), on_native())]
    (ref, ref_events, ref_calls, n_ref), (got, events, calls, n_got), native = (
        t.result() for t in runs
    )
    assert n_ref == 1 and n_got >= 2, (n_ref, n_got)
    for label, (info, evs) in zip(
        ("reference", "continued", "native"),
        ((ref, ref_events), (got, events), native[:2]),
        strict=True,
    ):
        assert info.status == RunStatus.COMPLETED and info.output == 3, info
        assert info.stage("r").attempt == 3
        _check_events(evs)
        assert _attempts(evs) == [
            ("stage.started", 1, None),
            ("stage.failed", 1, True),
            ("stage.started", 2, None),
            ("stage.failed", 2, True),
            ("stage.started", 3, None),
            ("stage.completed", 3, None),
        ]
        failed = [e for e in evs if e.type == "stage.failed"]
        assert failed[0].data["error"]["type"] == "StageTimeoutError", failed[0].data
        # the timeout counts from the try that resumed after the nap (not ~1 s late)
        suspended = [e for e in evs if e.type == "stage.suspended"]
        woke = datetime.fromisoformat(suspended[0].data["until"])
        late = (failed[0].at - woke).total_seconds()
        assert TIMEOUT_S - 0.1 <= late < TIMEOUT_S + 0.9, (label, late)
        # the backoffs: INITIAL_S, then twice that, each from the failure
        started = _at(evs, "stage.started")
        for k, want in ((0, INITIAL_S), (1, INITIAL_S * 2)):
            gap = (started[k + 1] - failed[k].at).total_seconds()
            assert want - 0.05 <= gap < want + 0.9, (label, k, gap)
    assert calls.counts == ref_calls.counts == native[2].counts, (calls.counts, native[2].counts)
    assert calls.counts["hang"] == 1 and calls.counts["before"] == 3
    graph = retry_workflow(Calls()).graph()
    assert normalise(events, graph) == normalise(ref_events, graph)
    assert normalise(native[1], graph) == normalise(events, graph)


# -- 2. a cancel right around a continue ---------------------------------------------------------
def cancel_workflow(calls: Calls) -> Workflow[In]:
    wf = Workflow(f"can-cancel-{_ns()}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        calls.hit("a")
        return "A"

    @a.compensation
    async def undo_a(ctx: StageContext[In], out: str) -> None:
        calls.hit(f"undo:{out}")

    @wf.stage(after=[a], signals=["go"])
    async def b(ctx: StageContext[In]) -> Any:
        await ctx.step.run("before", lambda: calls.hit("before"))
        got = await ctx.step.wait_for_signal("go", timeout=600)
        calls.hit("b")
        return got

    return wf


@pytest.mark.parametrize("when", ["race", "gap"])
async def test_cancel_around_a_continue(make_engine: EngineFactory, when: str) -> None:
    """A cancel sent as b suspends (the run continues as new in that same moment) or once
    the continue happened (before the new execution's first task): the run ends cancelled,
    a compensated once, and every read says so."""
    calls = Calls()
    wf = cancel_workflow(calls)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options=dict(ONCE))
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():

            async def suspended() -> bool:
                return any(e.type == "stage.suspended" for e in sink.for_run(run.id))

            await until("b's wait", suspended)
            if when == "gap":
                await _went_on(engine, run.id)
            cancelled = await engine.cancel(run.id)
            done = await engine.wait(run.id, timeout=60)
            assert done.status == RunStatus.CANCELLED, done
            assert cancelled.status in (RunStatus.CANCELLED, RunStatus.COMPENSATING), cancelled
            assert [(s.id, s.status) for s in done.stages] == [
                ("a", "compensated"),
                ("b", "cancelled"),
            ]
            again = await engine.cancel(run.id)  # a no-op
            assert again.status == RunStatus.CANCELLED

            async def listed() -> bool:
                found = await engine.list_runs(id_prefix=run.id)
                return [(r.id, r.status) for r in found] == [(run.id, RunStatus.CANCELLED)]

            await until("list_runs to show it cancelled", listed, timeout=20)
            assert (await engine.get_run(run.id)).model_dump() == done.model_dump()
            events = await engine.events(run.id)
        n = len(await executions(engine, run.id))
    assert n >= (2 if when == "gap" else 1)
    assert calls.counts == {"a": 1, "before": 1, "undo:A": 1}
    _check_events(events)
    assert [e.type for e in events] == [
        "run.created",
        "run.started",
        "stage.started",
        "stage.completed",
        "stage.started",
        "stage.suspended",
        "stage.cancelled",
        "stage.compensated",
        "run.cancelled",
    ]


# -- 3. a parallel group in flight past the threshold --------------------------------------------
FAN = 5


def fan_workflow(calls: Calls) -> Workflow[In]:
    """Five siblings (one waits for a signal, one naps, one polls, two return at once), then
    a join that reads each output. The run continues once the three wait (the naps and
    poll intervals long enough for that: see ``_due_before_next``), again once f0 alone
    waits, and once more after the signal. (A nap of 3.5 s and a poll every 3 s left a
    loaded host no moment without a timer due within the continue's hold: no continue came
    while the group was in flight.)"""
    wf = Workflow(f"can-fan-{_ns()}", input=In, version="v1")

    @wf.stage(signals=["go"])
    async def f0(ctx: StageContext[In]) -> int:
        await ctx.step.run("b0", lambda: calls.hit("b0"))
        return int((await ctx.step.wait_for_signal("go", timeout=600))["v"])

    @wf.stage
    async def f1(ctx: StageContext[In]) -> int:
        await ctx.step.run("b1", lambda: calls.hit("b1"))
        await ctx.step.sleep("nap", 6.0)
        return 10

    @wf.stage
    async def f2(ctx: StageContext[In]) -> int:
        n = await ctx.step.wait_for(
            "p", lambda: calls.hit("poll") >= 2 or None, interval=5.0, timeout=600
        )
        return 100 if n else -1

    @wf.stage
    async def f3(ctx: StageContext[In]) -> int:
        calls.hit("f3")
        return 1000

    @wf.stage
    async def f4(ctx: StageContext[In]) -> int:
        calls.hit("f4")
        return 10000

    @wf.stage(after=[f0, f1, f2, f3, f4])
    async def join(ctx: StageContext[In]) -> dict[str, Any]:
        calls.hit("join")
        return {f"f{i}": ctx.output_of(f"f{i}") for i in range(FAN)}

    return wf


async def test_fan_out_in_flight_across_continues(make_engine: EngineFactory) -> None:
    async def one(options: dict[str, Any]) -> dict[str, Any]:
        calls = Calls()
        wf = fan_workflow(calls)
        sink = MemorySink()
        engine = make_engine(
            Registry([wf]), sink=sink, task_queue=f"fan-{_ns()}", options=dict(options)
        )
        async with engine:
            run = await engine.start(wf, {"n": 1})
            async with engine.worker():

                async def others_done() -> bool:
                    info = await engine.get_run(run.id)
                    return all(info.stage(f"f{i}").status == "completed" for i in (1, 2, 3, 4))

                await until("f1..f4", others_done, timeout=30)
                waiting = await engine.get_run(run.id)
                assert waiting.stage("f0").waiting_for == "signal:go", waiting
                if options:
                    await _went_on(engine, run.id, 2)
                res = await engine.signal(run.id, "go", {"v": 1})
                assert res.delivered and not res.already_completed, res
                info = await engine.wait(run.id, timeout=60)
            events = await engine.events(run.id)
            delivered = sorted(
                {e.id: e for e in sink.for_run(run.id)}.values(), key=lambda e: e.seq
            )
            assert [e.id for e in delivered] == [e.id for e in events]
            steps = [(s.stage, s.name, s.completed) for s in await engine.steps(run.id)]
            return {
                "info": info,
                "trace": normalise(events, wf.graph()),
                "events": events,
                "calls": dict(calls.counts),
                "steps": sorted(steps),
                "executions": len(await executions(engine, run.id)),
                "starts": [ex.start_time for ex in await executions(engine, run.id)],
            }

    ref, got = await _both(one({}), one(ONCE))
    assert ref["executions"] == 1 and got["executions"] >= 3, got["executions"]
    want = {"f0": 1, "f1": 10, "f2": 100, "f3": 1000, "f4": 10000}
    for out in (ref, got):
        info = out["info"]
        assert info.status == RunStatus.COMPLETED and info.output == want, info
        _check_events(out["events"])
        assert [s.attempt for s in info.stages] == [1] * (FAN + 1)
        assert out["calls"]["join"] == 1 and out["calls"]["f3"] == 1 and out["calls"]["f4"] == 1
        assert out["calls"]["b0"] == 1 and out["calls"]["b1"] == 1 and out["calls"]["poll"] == 2
        completed = [e.stage for e in out["events"] if e.type == "stage.completed"]
        assert sorted(completed) == sorted([*want, "join"])
    # the first continue came while f0, f1 and f2 all waited (the group in flight)
    ended = [e.at for e in got["events"] if e.type == "stage.completed" and e.stage in ("f1", "f2")]
    assert got["starts"][1] < min(ended), (got["starts"], ended)
    assert got["trace"] == ref["trace"]
    assert got["steps"] == ref["steps"]
