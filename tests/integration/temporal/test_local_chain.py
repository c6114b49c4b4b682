"""Consecutive ``local=True`` stages run as one local activity (``GraphWorkflow._chain``): the
history holds one marker for the chain, and everything a user sees (outputs, stage records,
events and their order, signals, retries, compensation, a cancel) is what the same graph does
with regular activities."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any, Literal

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from engine_port import MemorySink, Registry, Retry, StageContext, Workflow

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal

Mode = Literal["completes", "signalled", "waits", "retries", "fails", "undo_retried", "cancelled"]


class Case(BaseModel):
    mode: str = "completes"


def chain_graph(wf_id: str, local: bool, counts: dict[str, int], running: asyncio.Event) -> Any:
    """a -> b -> c, each alone in its group (a chain of three when ``local``)."""
    wf = Workflow(wf_id, input=Case)

    def bump(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    @wf.stage(local=local)
    async def a(ctx: StageContext[Case]) -> dict[str, Any]:
        bump("a")
        ctx.emit("a.done", {"n": 1})
        return {"a": 1}

    @a.compensation
    async def undo_a(ctx: StageContext[Case], out: dict[str, Any]) -> None:
        bump("undo_a")

    @wf.stage(
        after=[a],
        local=local,
        retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)),
    )
    async def b(ctx: StageContext[Case]) -> dict[str, Any]:
        bump("b")
        mode = ctx.input.mode
        got = None
        if mode in ("signalled", "waits"):
            got = await ctx.step.wait_for_signal("go")
        if mode == "retries" and ctx.attempt == 1:
            raise RuntimeError("b's first attempt fails")
        if mode == "cancelled":
            running.set()
            await asyncio.sleep(60)
        return {"b": ctx.output_of("a")["a"] + 1, "got": got}

    @b.compensation
    async def undo_b(ctx: StageContext[Case], out: dict[str, Any]) -> None:
        bump("undo_b")
        if ctx.input.mode == "undo_retried" and counts["undo_b"] == 1:
            raise RuntimeError("undo_b's first attempt fails")

    # (its three tries a few ms apart: the default backoff of 1 s, then 2 s, cost each run
    # of the failing modes 3 s)
    @wf.stage(after=[b], local=local, retry=Retry(initial_interval=timedelta(milliseconds=50)))
    async def c(ctx: StageContext[Case]) -> list[Any]:
        bump("c")
        if ctx.input.mode in ("fails", "undo_retried"):
            raise ValueError("c refuses")
        return [ctx.output_of("a"), ctx.output_of("b")]

    return wf


async def _markers(address: str, run_id: str) -> list[dict[str, Any]]:
    """The local activities of a run's history: type, summary, failure (type, message)."""
    client = await Client.connect(address)
    history = await client.get_workflow_handle(run_id).fetch_history()
    out = []
    for ev in history.events:
        if ev.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        attrs = ev.marker_recorded_event_attributes
        if attrs.marker_name != "core_local_activity":
            continue
        data = json.loads(attrs.details["data"].payloads[0].data)
        failure = None
        if attrs.HasField("failure"):
            f = attrs.failure.cause if attrs.failure.HasField("cause") else attrs.failure
            failure = (f.application_failure_info.type, f.message)
        out.append(
            {
                "type": data["activity_type"],
                "summary": json.loads(ev.user_metadata.summary.data or b"null"),
                "failure": failure,
            }
        )
    return out


async def _run(make_engine: EngineFactory, mode: Mode, local: bool) -> tuple[Any, ...]:
    counts: dict[str, int] = {}
    running = asyncio.Event()
    wf_id = f"chain-{mode}-{'l' if local else 'r'}"
    sink = MemorySink()
    engine = make_engine(Registry([chain_graph(wf_id, local, counts, running)]), sink=sink)
    async with engine:
        run = await engine.start(wf_id, {"mode": mode})
        if mode == "signalled":
            # buffered before a worker runs the run: b takes it, no suspension (a signal sent
            # while a local stage's workflow task runs only reaches the run after the task,
            # so a local stage that waits for it suspends and resumes, chained or not)
            await engine.signal(run.id, "go", {"ok": 1})
        async with engine.worker():
            return run, await _until_done(engine, sink, run, mode, running, counts)


async def _until_done(
    engine: Any,
    sink: MemorySink,
    run: Any,
    mode: Mode,
    running: asyncio.Event,
    counts: dict[str, int],
) -> tuple[Any, ...]:
    if mode == "waits":
        deadline = asyncio.get_running_loop().time() + 20
        while not any(e.type == "stage.suspended" for e in sink.for_run(run.id)):
            assert asyncio.get_running_loop().time() < deadline, trace(sink, run)
            await asyncio.sleep(0.02)
        await engine.signal(run.id, "go", {"ok": 2})
    if mode == "cancelled":
        await asyncio.wait_for(running.wait(), 20)
        await engine.cancel(run.id)
    info = await engine.wait(run.id, timeout=30)
    await engine.flush_events()
    shape = {
        "status": info.status,
        "output": info.output,
        "error": None if info.error is None else (info.error.type, info.error.message),
        "stages": [(s.id, s.status, s.attempt, s.output) for s in info.stages],
    }
    business = [(e.type, e.stage, e.data) for e in sink.for_run(run.id) if e.business]
    return shape, trace(sink, run), business, counts


@pytest.mark.parametrize(
    "mode", ["completes", "signalled", "waits", "retries", "fails", "undo_retried"]
)
async def test_a_local_chain_does_what_the_same_stages_do_as_activities(
    make_engine: EngineFactory, temporal_address: str, mode: Mode
) -> None:
    _, regular = await _run(make_engine, mode, local=False)
    run, chained = await _run(make_engine, mode, local=True)
    assert chained == regular
    markers = await _markers(temporal_address, run.id)
    head = markers[0]
    assert head["type"] == "a" and head["summary"] == "a attempt 1, then b, c", markers
    shape = chained[0]
    if mode in ("completes", "signalled"):
        # one local activity ran the three stages (one per stage before 2026-12-03)
        assert [m["type"] for m in markers] == ["a"], markers
        assert shape["output"] == [
            {"a": 1},
            {"b": 2, "got": None if mode == "completes" else {"ok": 1}},
        ]
    elif mode == "waits":
        # b suspended inside the chain; its resumed try (with c after it) is a chain of its own
        assert [m["summary"] for m in markers] == ["a attempt 1, then b, c", "b attempt 1, then c"]
        assert shape["output"][1]["got"] == {"ok": 2}
    elif mode == "retries":
        # b's failed attempt shows as a failed local activity with b's own error (red in
        # the UI), then its attempt 2 runs with c after it
        assert head["failure"] == ("RuntimeError", "b's first attempt fails"), markers
        assert [m["summary"] for m in markers] == ["a attempt 1, then b, c", "b attempt 2, then c"]
    else:
        assert head["failure"] == ("ValueError", "c refuses"), markers
        # a compensation's retry runs it again (its first try's journaled result is its own)
        undone = 2 if mode == "undo_retried" else 1
        assert shape["status"] == "failed", shape
        assert chained[3]["undo_a"] == 1 and chained[3]["undo_b"] == undone


async def test_a_cancel_while_a_chained_stage_runs_keeps_the_stages_before_it(
    make_engine: EngineFactory,
) -> None:
    """The run is cancelled while b runs inside a's chain: a completed before (it is
    compensated), b ends cancelled, c never starts, as with regular activities."""
    _, regular = await _run(make_engine, "cancelled", local=False)
    _, chained = await _run(make_engine, "cancelled", local=True)
    assert chained == regular
    shape, _, _, counts = chained
    assert shape["status"] == "cancelled"
    assert [(s[0], s[1]) for s in shape["stages"]] == [
        ("a", "compensated"),
        ("b", "cancelled"),
        ("c", "skipped"),
    ]
    assert counts.get("undo_a") == 1 and "undo_b" not in counts


@pytest.mark.parametrize("chained", [False, True], ids=["alone", "chained"])
async def test_a_local_stage_does_not_run_again_when_a_signal_comes_while_it_runs(
    make_engine: EngineFactory, chained: bool
) -> None:
    """A signal that reaches the run while its last workflow task runs local stages makes
    Temporal refuse that task's completion: the local activities' results are lost with it
    and the next task runs them again. Their bodies ran twice (a non-journaled side effect
    twice, a flaky step's second run deciding the outcome) before each local try journaled its
    result document (``_activities._Recorded``)."""
    runs: dict[str, int] = {}
    running, release = asyncio.Event(), asyncio.Event()
    wf = Workflow(f"once-{'chained' if chained else 'alone'}", input=Case)

    @wf.stage(local=True)
    async def first(ctx: StageContext[Case]) -> int:
        runs["first"] = runs.get("first", 0) + 1
        if not chained:
            running.set()
            await release.wait()
        return 1

    @wf.stage(after=[first], local=True)
    async def last(ctx: StageContext[Case]) -> int:
        runs["last"] = runs.get("last", 0) + 1
        if chained:
            running.set()
            await release.wait()
        return ctx.output_of("first") + 1

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start(wf.id, {})
        await asyncio.wait_for(running.wait(), 20)
        sent = await engine.signal(run.id, "unrelated", {"n": 1})
        assert not sent.delivered
        release.set()
        info = await engine.wait(run.id, timeout=30)
        await engine.flush_events()
    assert info.status == "completed" and info.output == 2
    assert runs == {"first": 1, "last": 1}
    assert trace(sink, run).count(("stage.started", "last")) == 1
