"""A worker whose lease was taken over (it stalled, and has not yet noticed at a heartbeat)
must not journal a step or take a signal for the attempt it no longer owns (DESIGN §5: the
new owner re-runs the attempt, replaying only what was journaled before the takeover).

The takeover is staged without timing: heartbeats are 30 s apart, the lease is expired by
hand and reaped, and every stage body is held at a gate of the test's own."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native import ClaimPending, ExecuteJob, NativeEngine, ReapStaleLeases
from driver_native._schema import jobs, signals, steps
from engine_port import NonRetryableError, StageContext, Workflow

from .conftest import MakeEngine

SETTINGS: dict[str, Any] = {"lease_seconds": 60.0, "job_heartbeat_interval": 30.0}


class In(BaseModel):
    n: int = 0


class Gates:
    """One gate per call, in call order: call ``i`` waits at gate ``i`` once it is entered."""

    def __init__(self) -> None:
        self.entered: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.open: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.calls = 0
        self.after: list[int] = []  # the calls that went on past the step under test

    async def pass_(self) -> int:
        i = self.calls
        self.calls += 1
        self.entered[i].set()
        await self.open[i].wait()
        return i


async def _expire_and_reap(engine: NativeEngine, job_id: int) -> None:
    """The stalled worker's lease runs out (without waiting for it) and is taken back."""
    kernel = engine.kernel
    await kernel.db.tx(
        lambda c: c.execute(
            sa.update(jobs)
            .where(jobs.c.id == job_id)
            .values(lease_expires_at=jobs.c.lease_expires_at - 120)
        )
    )
    assert await kernel.dispatch(ReapStaleLeases()) == 1


async def _step_rows(engine: NativeEngine, run_id: str) -> dict[str, Any]:
    """Each journaled step: (completed, its result, read through the blob store if spilled)."""

    def q(conn: sa.Connection) -> list[Any]:
        return list(conn.execute(sa.select(steps).where(steps.c.run_id == run_id)).all())

    claim = engine.kernel.claim
    rows = await engine.kernel.db.read(q)
    return {r.name: (bool(r.completed), await claim.load(r.result, run_id=run_id)) for r in rows}


async def _unconsumed(engine: NativeEngine, run_id: str) -> int:
    def q(conn: sa.Connection) -> int:
        stmt = sa.select(sa.func.count()).where(
            signals.c.run_id == run_id, signals.c.consumed.is_(False)
        )
        return int(conn.execute(stmt).scalar_one())

    return await engine.kernel.db.read(q)


async def _settle(task: asyncio.Task[Any]) -> Any:
    with contextlib.suppress(asyncio.CancelledError):
        return await asyncio.wait_for(task, 10)
    return "cancelled"


@pytest.mark.parametrize("spill", [None, 0], ids=["inline", "spilled"])
async def test_a_taken_over_attempt_does_not_journal_its_step(
    make_engine: MakeEngine, spill: int | None
) -> None:
    """``spilled``: every step result goes to the blob store; the stale attempt's blob must
    not replace the one the new owner's journaled row refers to either."""
    gates = Gates()
    wf = Workflow("lost-lease-step", input=In)

    async def held() -> str:
        return f"call-{await gates.pass_()}"

    @wf.stage
    async def s(ctx: StageContext[In]) -> list[str]:
        first = await ctx.step.run("first", held)
        gates.after.append(gates.calls)

        async def then() -> str:
            return f"{first}+second"

        second = await ctx.step.run("second", then)
        return [first, second]

    spilling = {} if spill is None else {"spill_threshold_bytes": spill}
    engine = await make_engine(wf, **SETTINGS, **spilling)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    [job_a] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # A runs step "first", and stalls
    await _expire_and_reap(engine, job_a.id)
    [job_b] = await kernel.dispatch(ClaimPending("worker-b", limit=1))
    gates.open[1].set()
    b = asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, "worker-b")))
    assert await _settle(b) == "completed"  # B re-ran the attempt and recorded its outcome
    assert (await _step_rows(engine, run.id))["first"] == (True, "call-1")
    # A wakes up and its step "first" returns: the journal must keep what B's attempt used
    gates.open[0].set()
    assert await _settle(a) == "discarded"
    rows = await _step_rows(engine, run.id)
    assert rows["first"] == (True, "call-1"), "the stale attempt journaled its step result"
    assert rows["second"] == (True, "call-1+second")
    assert gates.after == [2]  # only B's attempt went on past the step
    info = await engine.get_run(run.id)
    assert info.status == "completed"
    assert info.output == ["call-1", "call-1+second"]


async def test_a_taken_over_attempt_does_not_take_a_signal(make_engine: MakeEngine) -> None:
    """The stale attempt takes the signal the new attempt waits for: the new attempt (begun
    before) finds none, journals its wait open again and suspends; the signal is gone."""
    gates = Gates()
    wf = Workflow("lost-lease-signal", input=In)

    @wf.stage
    async def w(ctx: StageContext[In]) -> Any:
        await gates.pass_()  # (not a step: nothing journaled before the wait)
        return await ctx.step.wait_for_signal("go")

    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    [job_a] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # A stalls before its wait
    await _expire_and_reap(engine, job_a.id)
    # B re-runs the attempt: no signal yet, its wait is journaled open and the stage suspends
    [job_b] = await kernel.dispatch(ClaimPending("worker-b", limit=1))
    gates.open[1].set()
    assert await _settle(asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, "worker-b")))) == (
        "suspended"
    )
    await engine.signal(run.id, "go", {"n": 7})
    # the signal wakes the stage; B leases it again and begins the attempt
    [job_b2] = await kernel.dispatch(ClaimPending("worker-b", limit=1))
    b2 = asyncio.create_task(kernel.dispatch(ExecuteJob(job_b2, "worker-b")))
    await asyncio.wait_for(gates.entered[2].wait(), 10)
    # now A wakes up and reaches its wait: it must not take the signal
    gates.open[0].set()
    assert await _settle(a) == "discarded"
    assert await _unconsumed(engine, run.id) == 1, "the stale attempt took the signal"
    assert (await _step_rows(engine, run.id))["go"][0] is False
    gates.open[2].set()
    assert await _settle(b2) == "completed"
    info = await engine.get_run(run.id)
    assert info.status == "completed"
    assert info.output == {"n": 7}


async def test_a_taken_over_compensation_does_not_journal_its_step(
    make_engine: MakeEngine,
) -> None:
    gates = Gates()
    wf = Workflow("lost-lease-saga", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        return "reserved"

    @a.compensation
    async def release(ctx: StageContext[In], output: str) -> None:
        async def undo() -> str:
            return f"call-{await gates.pass_()}"

        await ctx.step.run("undo", undo)
        gates.after.append(gates.calls)

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        raise NonRetryableError("out of stock")

    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    for worker in ("worker-a", "worker-a"):  # stage a completes, stage b fails for good
        [job] = await kernel.dispatch(ClaimPending(worker, limit=1))
        await kernel.dispatch(ExecuteJob(job, worker))
    [job_a] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    assert job_a.kind == "compensate"
    a_task = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # A runs step "undo", and stalls
    await _expire_and_reap(engine, job_a.id)
    [job_b] = await kernel.dispatch(ClaimPending("worker-b", limit=1))
    gates.open[1].set()
    assert await _settle(asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, "worker-b")))) == (
        "compensated"
    )
    gates.open[0].set()
    assert await _settle(a_task) == "discarded"
    rows = await _step_rows(engine, run.id)
    assert rows["undo"] == (True, "call-1"), "the stale compensation journaled its step"
    assert gates.after == [2]
    info = await engine.get_run(run.id)
    assert info.status == "failed"
    assert info.stage("a").status == "compensated"
