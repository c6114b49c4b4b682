"""What an operator reads in a run's Temporal history (Web UI, ``temporal workflow show``):
the business values, failures in red. Read through the Temporal API, as the UI does."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload, WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.common import RawValue
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from driver_temporal._devserver import find_temporal_binary
from engine_port import MemorySink, Registry, Retry, StageContext, Workflow
from engine_port._blobs import SPILL_MARKER

from .conftest import EngineFactory, trace, wait_for_event

pytestmark = pytest.mark.temporal


class Order(BaseModel):
    item: str
    qty: int


def _data(payload: Payload) -> Any:
    """A payload as the UI shows it: its data (metadata is not rendered)."""
    return json.loads(payload.data)


async def _history(engine: Any, run_id: str) -> list[HistoryEvent]:
    history = await engine._conn.get_workflow_handle(run_id).fetch_history()
    return list(history.events)


def _of(events: list[HistoryEvent], kind: int) -> list[HistoryEvent]:
    return [e for e in events if e.event_type == kind]


def _local_activity_type(event: HistoryEvent) -> str | None:
    """The activity type of a local activity's marker (None: another marker, a patch)."""
    attrs = event.marker_recorded_event_attributes
    if attrs.marker_name != "core_local_activity":
        return None
    data = json.loads(attrs.details["data"].payloads[0].data)
    return str(data["activity_type"])


async def test_input_result_and_stage_values_are_business_values(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("shop", input=Order)

    @wf.stage
    async def reserve(ctx: StageContext[Order]) -> dict[str, Any]:
        return {"reserved": ctx.input.qty}

    @wf.stage(after=[reserve])
    async def big(ctx: StageContext[Order]) -> str:
        return "x" * 3000  # over the spill threshold below

    @wf.stage(after=[reserve, big])
    async def ship(ctx: StageContext[Order]) -> str:
        return f"shipped {ctx.input.item}"

    engine = make_engine(Registry([wf]), spill_threshold_bytes=1000)
    async with engine:
        run = await engine.start("shop", {"item": "book", "qty": 2})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed", info
        events = await _history(engine, run.id)
        desc = await engine._conn.get_workflow_handle(run.id).describe()
        memo = await desc.memo()

    started = _of(events, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)[0]
    attrs = started.workflow_execution_started_event_attributes
    # the workflow's input is the run's input as the user gave it, no engine document
    assert [_data(p) for p in attrs.input.payloads] == [{"item": "book", "qty": 2}]
    # the engine's metadata sits in the memo, the graph in the input's metadata (out of
    # sight: the memo is written again at every change of the run, the input once)
    assert memo["wfe_start"]["workflow_id"] == "shop"
    assert "graph" not in memo["wfe_start"]
    assert "groups" in json.loads(attrs.input.payloads[0].metadata["wfe"])["graph"]
    assert memo["wfe_start"]["run_id"] == run.id
    # each stage in the run's memo: its fields that are set, no nulls (written at every change)
    assert all(v is not None for s in memo["wfe_run"]["stages"] for v in s.values())
    done = _of(events, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)[0]
    result = done.workflow_execution_completed_event_attributes.result.payloads
    assert [_data(p) for p in result] == ["shipped book"]

    scheduled = {
        e.activity_task_scheduled_event_attributes.activity_type.name: e
        for e in _of(events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    }
    assert set(scheduled) == {"reserve", "big", "ship"}
    first = scheduled["reserve"].activity_task_scheduled_event_attributes.input.payloads
    assert [_data(p) for p in first] == [{"item": "book", "qty": 2}]
    last = scheduled["ship"].activity_task_scheduled_event_attributes.input.payloads
    ship_in = [_data(p) for p in last]
    assert ship_in[0] == {"item": "book", "qty": 2}
    assert ship_in[1]["reserve"] == {"reserved": 2}
    ref = ship_in[1]["big"][SPILL_MARKER]  # above the threshold: a reference naming size, key
    assert ref["size"] > 1000 and ref["key"].startswith(f"runs/{run.id}/")

    results = {}
    for e in _of(events, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED):
        sched = next(
            s
            for s in events
            if s.event_id == e.activity_task_completed_event_attributes.scheduled_event_id
        )
        name = sched.activity_task_scheduled_event_attributes.activity_type.name
        results[name] = _data(e.activity_task_completed_event_attributes.result.payloads[0])
    assert results["reserve"] == {"reserved": 2}
    assert results["ship"] == "shipped book"
    assert SPILL_MARKER in results["big"]


class Boom(Exception):
    pass


async def test_failed_attempt_is_a_failed_activity(make_engine: EngineFactory) -> None:
    wf = Workflow("flaky", input=Order)
    tries = {"n": 0}

    @wf.stage(retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=10)))
    async def charge(ctx: StageContext[Order]) -> str:
        tries["n"] += 1
        if tries["n"] == 1:
            raise Boom("card declined")
        return "charged"

    engine = make_engine(Registry([wf]))
    async with engine:
        run = await engine.start("flaky", {"item": "book", "qty": 1})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed", info
        events = await _history(engine, run.id)

    failed = _of(events, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED)
    assert len(failed) == 1  # the first attempt shows red...
    failure = failed[0].activity_task_failed_event_attributes.failure
    assert failure.message == "card declined"
    app = failure.application_failure_info
    assert app.type == "Boom"
    shown = _data(app.details.payloads[0])
    assert shown["stage"] == "charge" and shown["attempt"] == 1 and shown["retryable"]
    assert "card declined" in shown["traceback"]
    # ...and the workflow retried it as a new activity (the stage's own retry policy)
    assert len(_of(events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)) == 2
    assert len(_of(events, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)) == 1


def _signaled(events: list[HistoryEvent]) -> list[tuple[str, Any]]:
    """Each signal in the history: its name and its input as shown (JSON) or its encoding."""
    out: list[tuple[str, Any]] = []
    for e in _of(events, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED):
        attrs = e.workflow_execution_signaled_event_attributes
        p = attrs.input.payloads[0]
        shown = _data(p) if p.metadata["encoding"] == b"json/plain" else p.metadata["encoding"]
        out.append((attrs.signal_name, shown))
    return out


async def test_signals_are_temporal_signals_with_the_users_json(
    make_engine: EngineFactory, temporal_address: str
) -> None:
    wf = Workflow("approve", input=Order)

    @wf.stage
    async def first(ctx: StageContext[Order]) -> Any:
        return await ctx.step.wait_for_signal("approval")

    @wf.stage(after=[first])
    async def second(ctx: StageContext[Order]) -> Any:
        return {"first": ctx.output_of("first"), "second": await ctx.step.wait_for_signal("again")}

    engine = make_engine(Registry([wf]))
    async with engine:
        run = await engine.start("approve", {"item": "book", "qty": 1})
        handle = engine._conn.get_workflow_handle(run.id)
        async with engine.worker():
            await _until(engine, run.id, "signal:approval")
            # an operator's signal, as the docs show it: the JSON is the payload
            cli = await asyncio.create_subprocess_exec(
                find_temporal_binary(),
                "workflow",
                "signal",
                "--address",
                temporal_address,
                "--workflow-id",
                run.id,
                "--name",
                "approval",
                "--input",
                '{"ok":true}',
                stdout=asyncio.subprocess.DEVNULL,
            )
            assert await asyncio.wait_for(cli.wait(), 30) == 0
            await _until(engine, run.id, "signal:again")
            # a payload that is not JSON is rejected and recorded; the run goes on
            bad = Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00\x01")
            await handle.signal("again", RawValue(bad))
            res = await engine.signal(run.id, "again", [1, 2])
            assert res.delivered and not res.already_completed
            info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed", info
        assert info.output == {"first": {"ok": True}, "second": [1, 2]}
        events = await _history(engine, run.id)
        memo = await (await handle.describe()).memo()
    assert _signaled(events) == [
        ("approval", {"ok": True}),
        ("again", b"binary/plain"),
        ("again", [1, 2]),
    ]
    assert memo["wfe_rejected_signals"][0]["name"] == "again"
    assert "not JSON" in memo["wfe_rejected_signals"][0]["reason"]
    assert _of(events, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED) == []


async def _until(engine: Any, run_id: str, waiting_for: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        info = await engine.get_run(run_id)
        if any(s.waiting_for == waiting_for for s in info.stages):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never waited for {waiting_for}")


# the README's visibility queries ("Visibility queries that tell the truth")
_README_WAITING = "WfeStatus IN ('suspended', 'running') AND ExecutionStatus = 'Running'"
_README_FAILED = (
    "(WfeStatus = 'failed' OR (WfeStatus IN ('pending', 'running', 'suspended', 'compensating') "
    "AND ExecutionStatus IN ('Terminated', 'TimedOut')))"
)


async def test_terminate_by_an_operator_is_what_the_engine_reports(
    make_engine: EngineFactory,
) -> None:
    wf, charges = _held("held", local=False)

    engine = make_engine(Registry([wf]))
    async with engine:
        run = await engine.start("held", {"item": "book", "qty": 1})
        async with engine.worker():
            await _until(engine, run.id, "signal:release")
        await engine._conn.get_workflow_handle(run.id).terminate(
            reason="stuck order, ops ticket 42"
        )
        info = await engine.get_run(run.id)
        assert info.status == "failed"
        assert info.error is not None and "stuck order, ops ticket 42" in info.error.message
        assert [s.status for s in info.stages] == ["cancelled"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10  # visibility is eventually consistent
        failed = await engine.list_runs(workflow_id="held", status="failed")
        while not failed and loop.time() < deadline:
            await asyncio.sleep(0.1)
            failed = await engine.list_runs(workflow_id="held", status="failed")
        suspended = await engine.list_runs(workflow_id="held", status="suspended")
        # so do the queries the README gives operators (Web UI, `temporal workflow list`)
        this = f"WorkflowId = '{run.id}' AND "
        shown_waiting = [e.id async for e in engine._conn.list_workflows(this + _README_WAITING)]
        shown_failed = [e.id async for e in engine._conn.list_workflows(this + _README_FAILED)]
        assert (shown_waiting, shown_failed) == ([], [run.id])
        # redrive runs it again; the step journaled before the terminate stays done
        await engine.redrive(run.id)
        async with engine.worker():
            await _until(engine, run.id, "signal:release")
            await engine.signal(run.id, "release", "now")
            done = await engine.wait(run.id, timeout=30)
    assert [r.id for r in failed] == [run.id]
    assert suspended == []
    assert done.status == "completed" and done.output == "now"
    assert charges["n"] == 1


async def test_reset_by_an_operator_never_reruns_a_journaled_step(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("pay", input=Order)
    charges = {"n": 0}

    @wf.stage
    async def checkout(ctx: StageContext[Order]) -> Any:
        def charge_card() -> str:
            charges["n"] += 1
            return "charged"

        charged = await ctx.step.run("charge-card", charge_card)
        return {"charged": charged, "ship": await ctx.step.wait_for_signal("ship")}

    engine = make_engine(Registry([wf]))
    async with engine:
        run = await engine.start("pay", {"item": "book", "qty": 1})
        async with engine.worker():
            await _until(engine, run.id, "signal:ship")
            events = await _history(engine, run.id)
            first_task = _of(events, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)[0]
            # reset to before the stage's activity was scheduled (the Web UI's "Reset")
            await engine._conn.workflow_service.reset_workflow_execution(
                ResetWorkflowExecutionRequest(
                    namespace="default",
                    workflow_execution=WorkflowExecution(workflow_id=run.id),
                    reason="operator reset",
                    workflow_task_finish_event_id=first_task.event_id,
                    request_id=uuid.uuid4().hex,
                )
            )
            await _until(engine, run.id, "signal:ship")
            await engine.signal(run.id, "ship", "today")
            info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed", info
    assert info.output == {"charged": "charged", "ship": "today"}
    assert charges["n"] == 1  # the card was charged once, before the reset


async def _hand_written(
    engine: Any,
    flow: type,
    name: str,
    act: Any,
    args: list[Any],
    drive: Any = None,
) -> int:
    """The number of history events of a run of the hand-written workflow ``flow`` (named
    ``name``, with its activity ``act``) on a task queue of its own; ``drive(handle)`` acts
    on it after its start (a signal)."""
    queue = f"hand-{uuid.uuid4().hex[:8]}"
    async with Worker(
        engine._conn,
        task_queue=queue,
        workflows=[flow],
        activities=[act],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await engine._conn.start_workflow(
            name, args=args, id=f"hand-{uuid.uuid4().hex}", task_queue=queue
        )
        if drive is not None:
            await drive(handle)
        await handle.result()
    return len(list((await handle.fetch_history()).events))


@activity.defn(name="hand_noop")
async def _hand_noop(i: int) -> int:
    return i


@workflow.defn(name="hand_six")
class _HandSix:
    """The hand-written equivalent of a 6-stage linear graph: 6 regular activities, or 6
    local activities (``local=True`` stages)."""

    @workflow.run
    async def run(self, n: int, local: bool) -> int:
        call = workflow.execute_local_activity if local else workflow.execute_activity
        for i in range(6):
            n += await call(_hand_noop, i, start_to_close_timeout=timedelta(seconds=30))
        return n


@pytest.mark.parametrize("local", [False, True], ids=["activities", "local"])
async def test_history_stays_close_to_the_hand_written_one(
    make_engine: EngineFactory, local: bool
) -> None:
    wf = Workflow("six-local" if local else "six", input=Order)
    prev: Any = None
    for i in range(6):

        async def body(ctx: StageContext[Order], i: int = i) -> int:
            return i

        body.__name__ = f"s{i}"
        prev = wf.stage(after=[prev] if prev else [], local=local)(body)

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine:
        run = await engine.start(wf.id, {"item": "book", "qty": 1})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed", info
        history = await _history(engine, run.id)
        ours = len(history)
        hand = await _hand_written(engine, _HandSix, "hand_six", _hand_noop, [0, local])
    # measured: 45 events against 41 (56 while the memo was written at every stage and a
    # wfe.save_state local activity recorded the end; 65 when every workflow task published
    # its events with a wfe.publish local activity, 86 before events and memo writes were
    # coalesced per activation); local: 13 against 11 (14 with wfe.save_state, 26 when each
    # activation between its local activities wrote the memo and search attributes); the
    # goal of issue 13 is 1.5x
    assert ours <= 1.5 * hand, (ours, hand)
    # the stage activities carried the events and the worker of the last task recorded the
    # run's end (``_run_end``): no local activity but the local=True stages themselves (a
    # wfe.save_state local activity delivered the end before 2026-12-02 evening), and those
    # six in one local activity, the chain s0 heads (one per stage before 2026-12-03: 11 more
    # events)
    stages = ["s0"] if local else []
    markers = _of(history, EventType.EVENT_TYPE_MARKER_RECORDED)
    types = [t for t in map(_local_activity_type, markers) if t is not None]
    assert types == stages, types
    # every event reached the sink, once each, in order (same ids and order as native)
    assert trace(sink, run) == [
        ("run.created", None),
        ("run.started", None),
        *[(t, f"s{i}") for i in range(6) for t in ("stage.started", "stage.completed")],
        ("run.completed", None),
    ]


@activity.defn(name="hand_echo")
async def _hand_echo(payload: Any) -> Any:
    return payload


@workflow.defn(name="hand_signal")
class _HandSignal:
    """The hand-written equivalent of a stage that starts on a signal: ``wait_condition``
    on the signal, then one activity given its payload."""

    def __init__(self) -> None:
        self._got: list[Any] = []

    @workflow.signal(name="go")
    def go(self, payload: Any) -> None:
        self._got.append(payload)

    @workflow.query(name="waiting")
    def waiting(self) -> bool:
        return not self._got

    @workflow.run
    async def run(self) -> Any:
        await workflow.wait_condition(lambda: bool(self._got))
        return await workflow.execute_activity(
            _hand_echo, self._got[0], start_to_close_timeout=timedelta(seconds=30)
        )


async def test_a_stage_starting_on_a_signal_waits_in_the_workflow(
    make_engine: EngineFactory,
) -> None:
    """``after_signal``: no activity runs before the signal (the workflow waits, as a
    hand-written ``wait_condition``), so the run's history stays within 1.5x of the
    hand-written one; the body waiting for the signal itself ran an activity up to the wait
    and another after it: 27 events against 15."""
    wf = Workflow("gate-history", input=Order)

    @wf.stage(after_signal="go")
    async def approve(ctx: StageContext[Order]) -> Any:
        return await ctx.step.wait_for_signal("go")

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start(wf.id, {"item": "book", "qty": 1})
        await wait_for_event(sink, run.id, "stage.suspended")
        # an operator's signal, as `temporal workflow signal --name go` sends it
        await engine._conn.get_workflow_handle(run.id).signal("go", {"ok": True})
        info = await engine.wait(run.id, timeout=30)
        assert info.status == "completed", info
        assert info.output == {"ok": True}
        history = await _history(engine, run.id)

        async def approve(handle: Any) -> None:
            assert await handle.query("waiting")  # (parked, as the run was: 15 events)
            await handle.signal("go", {"ok": True})

        hand = await _hand_written(engine, _HandSignal, "hand_signal", _hand_echo, [], approve)
    kinds = [e.event_type for e in history]
    signalled = kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    scheduled = [
        i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert len(scheduled) == 1 and scheduled[0] > signalled, kinds
    # measured 2026-12-06: 19 events against 15 (27 with the wait in the body)
    assert len(history) <= 1.5 * hand, (len(history), hand)
    assert trace(sink, run) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "approve"),
        ("stage.suspended", "approve"),
        ("stage.completed", "approve"),
        ("run.completed", None),
    ]


async def test_a_compensation_gets_the_stage_output_and_upstream_outputs(
    make_engine: EngineFactory,
) -> None:
    wf = Workflow("refund", input=Order)
    seen: list[Any] = []

    @wf.stage
    async def price(ctx: StageContext[Order]) -> int:
        return 7 * ctx.input.qty

    @wf.stage(after=[price])
    async def charge(ctx: StageContext[Order]) -> str:
        return f"charge-{ctx.output_of('price')}"

    @charge.compensation
    async def refund(ctx: StageContext[Order], out: str) -> None:
        seen.append((out, ctx.output_of("price"), ctx.input.item))

    @wf.stage(after=[charge])
    async def ship(ctx: StageContext[Order]) -> None:
        raise ValueError("no courier")

    engine = make_engine(Registry([wf]))
    async with engine:
        run = await engine.start("refund", {"item": "book", "qty": 3})
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
        events = await _history(engine, run.id)
    assert info.status == "failed", info
    assert seen == [("charge-21", 21, "book")]
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in _of(events, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    ]
    comp = next(a for a in scheduled if a.activity_type.name == "charge.compensate")
    shown = [_data(p) for p in comp.input.payloads]
    assert shown == ["charge-21", {"item": "book", "qty": 3}, {"price": 21}]


@pytest.mark.temporal
async def test_a_fan_out_delivers_each_event_about_once(make_engine: EngineFactory) -> None:
    """Stage activities scheduled together do not each carry the same events: in a 1 -> 20 -> 1
    fan-out, 20 siblings carried the whole outbox each, so the sink got every early event up
    to 20 times (and the fan-out ran 2.4x slower than hand-written temporalio; 5.9x with the
    carrying). Delivery stays at least once; a repeat is allowed only when a delivery races
    another, not per sibling."""
    wf = Workflow("fan-carry", input=Order)

    @wf.stage
    async def first(ctx: StageContext[Order]) -> int:
        return 0

    mids = []
    for i in range(20):

        async def mid(ctx: StageContext[Order], i: int = i) -> int:
            return i

        mids.append(wf.stage(id=f"mid{i:02d}", after=[first])(mid))

    @wf.stage(after=mids)
    async def last(ctx: StageContext[Order]) -> int:
        return 20

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("fan-carry", {"item": "x", "qty": 1})
        assert (await engine.wait(run.id, timeout=60)).output == 20
        unique = {e.id for e in sink.events if e.run_id == run.id}
        delivered = [e for e in sink.events if e.run_id == run.id]
        assert any(e.type == "run.completed" for e in delivered)
        assert len(delivered) <= 2 * len(unique), (len(delivered), len(unique))


async def test_redrive_after_a_terminate_of_a_waiting_local_stage_runs_it_again(
    make_engine: EngineFactory,
) -> None:
    """A ``local=True`` stage journals its try's result document (kind ``outcome``) beside its
    steps; redriving a run an operator terminated while such a stage waited carried that
    document into the stage's ledger as a step, and every try of the redriven stage then
    failed with ``KeyError: 'completed'``."""
    wf, charges = _held("held-local", local=True)

    engine = make_engine(Registry([wf]))
    async with engine:
        run = await engine.start("held-local", {"item": "book", "qty": 1})
        async with engine.worker():
            await _until(engine, run.id, "signal:release")
        await engine._conn.get_workflow_handle(run.id).terminate(reason="ops")
        await engine.redrive(run.id)
        async with engine.worker():
            await _until(engine, run.id, "signal:release")
            await engine.signal(run.id, "release", "now")
            done = await engine.wait(run.id, timeout=30)
    assert (done.status, done.output, charges["n"]) == ("completed", "now", 1)


def _held(wf_id: str, *, local: bool) -> tuple[Workflow[Order], dict[str, int]]:
    """One stage that charges a card (a journaled step, counted) and waits for ``release``."""
    wf = Workflow(wf_id, input=Order)
    charges = {"n": 0}

    @wf.stage(local=local)
    async def hold(ctx: StageContext[Order]) -> Any:
        def charge_card() -> str:
            charges["n"] += 1
            return "charged"

        await ctx.step.run("charge-card", charge_card)
        return await ctx.step.wait_for_signal("release")

    return wf, charges
