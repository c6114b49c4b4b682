"""What the caller waits for: the Temporal RPCs one ``wait()`` / ``signal()`` makes, counted
on a caller engine of its own (its worker runs on another engine, whose client is not
counted), or on the engine whose worker holds the run (its signals are answered in process),
so a round trip added back fails here."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.service import GrpcCompression

from driver_temporal import TemporalEngine
from driver_temporal import _engine as temporal_engine
from engine_port import Registry, StageContext, Workflow
from engine_port.errors import RunNotActiveError, WaitTimeoutError

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


def registry() -> Registry:
    wf = Workflow("rt", input=In)

    @wf.stage(signals=["go"])
    async def gate(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    two = Workflow("rt-two", input=In)

    @two.stage(signals=["go", "more"])
    async def both(ctx: StageContext[In]) -> Any:
        return [await ctx.step.wait_for_signal("go"), await ctx.step.wait_for_signal("more")]

    quick = Workflow("rt-quick", input=In)

    @quick.stage
    async def one(ctx: StageContext[In]) -> int:
        return ctx.input.n + 1

    return Registry([wf, two, quick])


@contextmanager
def counted(engine: TemporalEngine) -> Iterator[Counter[str]]:
    """Counts the RPCs the engine's client makes (by RPC name) while inside."""
    service = engine._conn.workflow_service._client
    calls: Counter[str] = Counter()
    real = service._rpc_call

    async def counting(rpc: str, *args: Any, **kw: Any) -> Any:
        calls[rpc] += 1
        return await real(rpc, *args, **kw)

    service._rpc_call = counting  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del service._rpc_call  # back to the class's


async def _until_suspended(engine: TemporalEngine, run_id: str) -> None:
    for _ in range(300):
        info = await engine.get_run(run_id)
        if any(s.status == "suspended" for s in info.stages):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the stage never suspended")


async def test_wait_on_a_completed_run_is_the_close_poll_alone(
    make_engine: EngineFactory,
) -> None:
    """A completed run's result carries its final RunInfo in its metadata: ``wait()`` reads
    it from the close event it long-polls, and says exactly what ``get_run`` says."""
    host = make_engine(registry())
    caller = make_engine(registry(), task_queue=host.settings.task_queue)
    async with host, caller, host.worker():
        run = await caller.start("rt-quick", {"n": 1})
        await host.wait(run.id, timeout=60)  # closed now
        with counted(caller) as calls:
            info = await caller.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == 2
        # before: the close poll, then get_run's describe (and before that a describe too)
        assert calls == Counter({"get_workflow_execution_history": 1}), calls
        assert info == await caller.get_run(run.id)
        # what an operator reads as the result is still the output alone
        assert await caller._conn.get_workflow_handle(run.id).result() == 2


async def test_wait_on_a_run_that_did_not_complete_is_the_close_poll_and_one_describe(
    make_engine: EngineFactory,
) -> None:
    host = make_engine(registry())
    caller = make_engine(registry(), task_queue=host.settings.task_queue)
    async with host, caller, host.worker():
        run = await caller.start("rt", {})
        await _until_suspended(caller, run.id)
        await caller.cancel(run.id)
        with counted(caller) as calls:
            info = await caller.wait(run.id, timeout=60)
        assert info.status == "cancelled"
        assert calls == Counter(
            {"get_workflow_execution_history": 1, "describe_workflow_execution": 1}
        ), calls
        assert info == await caller.get_run(run.id)


async def test_many_waits_at_once_keep_to_the_engines_describe_budget(
    make_engine: EngineFactory,
) -> None:
    """Each ``wait()`` peeks at its run's status (a describe) while the close poll runs, so a
    sink outage never holds it; 40 waits at once share ``_PEEKS_PER_S`` instead of peeking 3
    times each in their first 2 s (the bench's 1,000 waited-on runs paid ~5% of their CPU
    for it)."""
    engine = make_engine(registry())
    async with engine:  # no worker: the runs stay pending
        runs = [await engine.start("rt-quick", {"n": i}) for i in range(40)]
        with counted(engine) as calls:
            outcomes = await asyncio.gather(
                *(engine.wait(r.id, timeout=2.0) for r in runs), return_exceptions=True
            )
        assert all(isinstance(o, WaitTimeoutError) for o in outcomes), outcomes[:3]
        # 40 close polls, 40 describes of get_run at the timeout, and the peeks: before, 120
        # (at 0.25, 0.75 and 1.75 s each); now at most 2 s x 10/s
        peeks = calls["describe_workflow_execution"] - 40
        assert peeks <= 2.0 * temporal_engine._PEEKS_PER_S, calls


async def test_a_burst_of_first_starts_registers_the_version_once(
    make_engine: EngineFactory,
) -> None:
    """The first ``start()`` of a version makes it present on its task queue (a Worker
    Deployment describe, and a short-lived poller when it is not there yet); 20 concurrent
    first starts do that once, not 20 times each."""
    host = make_engine(registry())
    caller = make_engine(registry(), task_queue=host.settings.task_queue)
    async with host, caller, host.worker():
        # (the host's worker polls as the version: once Temporal lists it, the caller's
        # check finds it at once; while it did not, the check described it every 0.1 s,
        # a count that grew with the host's load: 7-10 beside a CPU hog)
        version = host.registry.latest_version("rt-quick")
        for _ in range(600):
            if await caller._version_present("rt-quick", version):
                break
            await asyncio.sleep(0.05)
        with counted(caller) as calls:
            runs = await asyncio.gather(*(caller.start("rt-quick", {"n": i}) for i in range(20)))
        assert len({r.id for r in runs}) == 20
        assert calls["describe_worker_deployment_version"] == 1, calls
        for i, r in enumerate(runs):
            assert (await caller.wait(r.id, timeout=60)).output == i + 1


async def test_signal_to_a_run_seen_running_is_the_signal_and_a_query(
    make_engine: EngineFactory,
) -> None:
    host = make_engine(registry())
    caller = make_engine(registry(), task_queue=host.settings.task_queue)
    async with host, caller, host.worker():
        run = await caller.start("rt", {})
        await _until_suspended(caller, run.id)
        with counted(caller) as calls:
            res = await caller.signal(run.id, "go", {"ok": True})
        assert res.delivered and not res.already_completed
        # before: a describe, the signal, then the status update (an update's own workflow
        # task, two history events); the caller saw the run suspended (get_run): no describe
        assert calls == Counter({"signal_workflow_execution": 1, "query_workflow": 1}), calls
        info = await host.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == {"ok": True}
        # the caller still remembers it running: the signal itself is refused
        with pytest.raises(RunNotActiveError):
            await caller.signal(run.id, "go", {"ok": False})
        history = await caller._conn.get_workflow_handle(run.id).fetch_history()
        assert not [
            e
            for e in history.events
            if e.HasField("workflow_execution_update_accepted_event_attributes")
        ]


async def test_signal_to_a_run_not_seen_here_reads_its_state_first(
    make_engine: EngineFactory,
) -> None:
    host = make_engine(registry())
    caller = make_engine(registry(), task_queue=host.settings.task_queue)
    async with host, caller, host.worker():
        run = await host.start("rt", {})
        await _until_suspended(host, run.id)
        with counted(caller) as calls:
            res = await caller.signal(run.id, "go", 1)
        assert res.delivered
        assert calls == Counter(
            {"describe_workflow_execution": 1, "signal_workflow_execution": 1, "query_workflow": 1}
        ), calls
        assert (await caller.wait(run.id, timeout=60)).output == 1
        with pytest.raises(RunNotActiveError):  # seen completed: refused before sending
            await caller.signal(run.id, "go", 2)


async def test_signal_while_no_worker_runs_is_buffered_and_taken_later(
    make_engine: EngineFactory,
) -> None:
    """No worker answers the delivery query: signal() reports from the run's last published
    state (its stage waits for the name: delivered) and the server keeps the signal for the
    next worker."""
    engine = make_engine(registry(), options={"signal_timeout": 1.0})
    async with engine:
        run = await engine.start("rt", {})
        async with engine.worker():
            await _until_suspended(engine, run.id)
        with counted(engine) as calls:
            res = await engine.signal(run.id, "go", "late")
        assert res.delivered and not res.already_completed
        assert calls["query_workflow"] == 1 and calls["update_workflow_execution"] == 0, calls
        async with engine.worker():
            info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == "late"


@contextmanager
def decoded_entries(engine: TemporalEngine) -> Iterator[list[Any]]:
    """The payloads the engine's client converts (one list entry per payload) while inside."""
    converter = engine._conn.data_converter
    seen: list[Any] = []
    real = converter.decode

    async def counting(payloads: Any, *args: Any, **kw: Any) -> Any:
        seen.extend(payloads)
        return await real(payloads, *args, **kw)

    object.__setattr__(converter, "decode", counting)
    try:
        yield seen
    finally:
        object.__delattr__(converter, "decode")  # back to the class's


async def test_reading_a_run_never_converts_its_start_document(
    make_engine: EngineFactory,
) -> None:
    """The ``wfe_start`` memo entry (graph and settings: the largest) is the workflow's to
    read: ``wait()`` and ``get_run`` convert only the entries they read, and an idempotent
    ``start()`` is the start and one describe."""
    host = make_engine(registry())
    caller = make_engine(registry(), task_queue=host.settings.task_queue)
    async with host, caller, host.worker():
        await caller.start("rt-quick", {"n": 0})  # (its first start checks the version)
        with counted(caller) as calls:
            run = await caller.start("rt-quick", {"n": 1}, idempotency_key="once")
        assert calls == Counter(
            {"start_workflow_execution": 1, "describe_workflow_execution": 1}
        ), calls
        await host.wait(run.id, timeout=60)
        with decoded_entries(caller) as seen:
            info = await caller.wait(run.id, timeout=60)
            assert (await caller.get_run(run.id)).output == info.output == 2
        raw = (await caller._conn.get_workflow_handle(run.id).describe()).raw_description
        start_doc = raw.workflow_execution_info.memo.fields["wfe_start"]
        assert seen and start_doc not in seen
        # (wait() read the RunInfo from the close event: get_run's describe alone converts the
        # other entries, once each; on a loaded machine the close poll may take longer than
        # wait()'s first status peek, a describe too, which converts those entries again)
        others = [v for k, v in raw.workflow_execution_info.memo.fields.items() if k != "wfe_start"]
        assert all(entry in others for entry in seen), seen
        assert len(seen) % len(others) == 0, seen


async def _three_signals(engine: TemporalEngine, run_id: str) -> None:
    """Buffered, an idempotent repeat, delivered: each status as ``signal`` reports it."""
    buffered = await engine.signal(run_id, "more", 1, idempotency_key="m")
    assert (buffered.delivered, buffered.already_completed) == (False, False)
    repeat = await engine.signal(run_id, "more", 2, idempotency_key="m")
    assert (repeat.delivered, repeat.already_completed) == (False, True)
    delivered = await engine.signal(run_id, "go", 3)
    assert (delivered.delivered, delivered.already_completed) == (True, False)


async def test_signal_answered_by_this_engines_worker_needs_no_query(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal handler of the engine's own worker hands its decision straight to the
    waiting ``signal`` (the worker's extern function, ``_waiters``): the signal RPC alone."""
    # (the query also goes out when the answer takes longer than a few ms, e.g. a workflow
    # task of the run in flight on a loaded machine: not here, so the count is exact)
    monkeypatch.setattr(temporal_engine, "_IN_PROCESS_GRACE_S", 30.0)
    host = make_engine(registry())
    async with host, host.worker():
        run = await host.start("rt-two", {})
        await _until_suspended(host, run.id)
        with counted(host) as calls:
            await _three_signals(host, run.id)
        # before: a ``wfe.internal.delivery`` query after each signal
        assert calls["query_workflow"] == 0, calls
        assert calls["signal_workflow_execution"] == 3, calls
        info = await host.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == [3, 1]
        assert len(host._waiters) == 0 and not host._elsewhere  # every waiter forgotten


async def test_signal_to_a_run_on_another_engines_worker_asks_with_the_query(
    make_engine: EngineFactory,
) -> None:
    """An engine with a worker of its own in this process (other task queue) signals a run
    another engine's worker holds: that worker's extern function does not know the delivery,
    so the answer comes from the query, as from another process."""
    host = make_engine(registry())
    other = make_engine(registry(), task_queue=f"o-{host.settings.task_queue}")
    async with host, other, host.worker(), other.worker():
        run = await host.start("rt-two", {})
        await _until_suspended(host, run.id)
        with counted(other) as calls:
            await _three_signals(other, run.id)
        assert calls["query_workflow"] == 3, calls
        info = await host.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == [3, 1]
        assert len(other._waiters) == len(host._waiters) == 0


async def test_signal_whose_in_process_answer_never_comes_falls_back_to_the_query(
    make_engine: EngineFactory,
) -> None:
    """A caller that serves the run's version but whose worker does not hold the run (one of
    several worker processes of a version) waits briefly for the in-process answer, then
    asks with the query; nothing is left waiting."""
    host = make_engine(registry())
    caller = make_engine(registry(), task_queue=host.settings.task_queue)
    async with host, caller, host.worker():
        run = await host.start("rt-two", {})
        await _until_suspended(caller, run.id)
        key = (caller.task_queue("rt-two"), run.version)
        caller._hosted[key] = 1  # as if a worker of the version ran in the caller's process
        with counted(caller) as calls:
            await _three_signals(caller, run.id)
        assert calls["query_workflow"] == 3, calls
        assert len(caller._waiters) == 0
        # only the first signal waited for the in-process answer: the query answers this run
        assert run.id in caller._elsewhere
        del caller._hosted[key]
        info = await host.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == [3, 1]


async def test_the_connection_to_a_loopback_server_is_uncompressed(
    make_engine: EngineFactory,
) -> None:
    """(``temporal_grpc_compression = "auto"``): temporalio's default gzip cost a fan-out ~11
    ms of this process's CPU and ~5 ms of the dev server's per run on a loopback address."""
    engine = make_engine(registry())
    async with engine, engine.worker():
        assert engine._conn.service_client.config.grpc_compression is GrpcCompression.NONE
        run = await engine.start("rt-quick", {"n": 1})
        assert (await engine.wait(run.id, timeout=30)).output == 2
    gzip = make_engine(registry(), temporal_grpc_compression="gzip")
    async with gzip, gzip.worker():
        assert gzip._conn.service_client.config.grpc_compression is GrpcCompression.GZIP
        run = await gzip.start("rt-quick", {"n": 2})
        assert (await gzip.wait(run.id, timeout=30)).output == 3
