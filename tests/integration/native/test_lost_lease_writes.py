"""A worker whose lease was taken over (it stalled, and has not yet noticed at a heartbeat)
must not journal a step, take a signal, record an outcome or a compensation for the attempt
it no longer owns (DESIGN §5: the new owner re-runs the attempt, replaying only what was
journaled before the takeover), also when the taker is that same worker (a later claim of
the job: only the claim token tells the attempts apart); and its heartbeat stops it, a
compensation's as a stage attempt's.

The takeover is staged without timing (``stalls``): heartbeats are 30 s apart (or the
takeover is one transaction), the lease is expired by hand and reaped, and every stage body
is held at a gate of the test's own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native import (
    CancelRun,
    ClaimPending,
    ExecuteJob,
    Heartbeat,
    NativeEngine,
    ReleaseJobs,
    _jobs,
    _progress,
)
from driver_native._schema import jobs, stages
from engine_port import NonRetryableError, StageContext, Workflow

from .conftest import MakeEngine, eventually, types
from .stalls import BEATING, SETTINGS, Gates, take_over
from .stalls import expire as _expire
from .stalls import expire_and_reap as _expire_and_reap
from .stalls import settle as _settle
from .stalls import step_rows as _step_rows
from .stalls import unconsumed as _unconsumed


class In(BaseModel):
    n: int = 0


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


TAKERS = pytest.mark.parametrize("taker", ["worker-b", "worker-a"], ids=["other", "itself"])
"""Who takes the stalled worker A's job over: another worker, or A itself (a later claim of
the same worker: only the claim's ``lease_token`` tells the stale attempt from the new one)."""


@TAKERS
async def test_a_taken_over_attempt_does_not_take_a_signal(
    make_engine: MakeEngine, taker: str
) -> None:
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
    [job_b] = await kernel.dispatch(ClaimPending(taker, limit=1))
    gates.open[1].set()
    assert await _settle(asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, taker)))) == (
        "suspended"
    )
    await engine.signal(run.id, "go", {"n": 7})
    # the signal wakes the stage; B leases it again and begins the attempt
    [job_b2] = await kernel.dispatch(ClaimPending(taker, limit=1))
    b2 = asyncio.create_task(kernel.dispatch(ExecuteJob(job_b2, taker)))
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


@TAKERS
async def test_a_step_of_the_stale_attempt_is_refused_while_the_new_one_runs(
    make_engine: MakeEngine, taker: str
) -> None:
    """Both attempts are in step "first" at once (the new one began after the takeover):
    the stale one's result must not be journaled for the new one to replay."""
    gates = Gates()
    wf = Workflow("lost-lease-step-both", input=In)

    async def held() -> str:
        return f"call-{await gates.pass_()}"

    @wf.stage
    async def s(ctx: StageContext[In]) -> str:
        first = await ctx.step.run("first", held)
        gates.after.append(gates.calls)
        return first

    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    [job_a] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # A runs step "first", and stalls
    await _expire_and_reap(engine, job_a.id)
    [job_b] = await kernel.dispatch(ClaimPending(taker, limit=1))
    b = asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, taker)))
    await asyncio.wait_for(gates.entered[1].wait(), 10)  # B runs step "first" too
    gates.open[0].set()
    assert await _settle(a) == "discarded"
    assert "first" not in await _step_rows(engine, run.id), "the stale attempt journaled"
    gates.open[1].set()
    assert await _settle(b) == "completed"
    assert gates.after == [2]  # only B's attempt went on past the step
    assert await _step_rows(engine, run.id) == {"first": (True, "call-1")}
    assert (await engine.get_run(run.id)).output == "call-1"


@TAKERS
@pytest.mark.parametrize("ends", ["returns", "raises"])
async def test_the_outcome_of_the_stale_attempt_is_discarded_while_the_new_one_runs(
    make_engine: MakeEngine, taker: str, ends: str
) -> None:
    """The stale attempt ends (returns, or fails) while the new one runs: its outcome is not
    recorded (no stage.completed or stage.failed of it), the new attempt's is."""
    gates = Gates()
    wf = Workflow("lost-lease-outcome", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> str:
        i = await gates.pass_()
        if ends == "raises" and i == 0:
            raise RuntimeError("the stale attempt fails")
        return f"call-{i}"

    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    [job_a] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)
    await _expire_and_reap(engine, job_a.id)
    [job_b] = await kernel.dispatch(ClaimPending(taker, limit=1))
    b = asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, taker)))
    await asyncio.wait_for(gates.entered[1].wait(), 10)
    gates.open[0].set()
    assert await _settle(a) == "discarded", "the stale attempt recorded its outcome"
    gates.open[1].set()
    assert await _settle(b) == "completed"
    info = await engine.get_run(run.id)
    assert (info.status, info.output) == ("completed", "call-1")
    assert info.stage("s").attempt == 1
    assert types(await engine.events(run.id), "s") == ["stage.started", "stage.completed"]


def _blocking(side: sa.Engine, pid: int) -> bool:
    """Whether a backend of the server waits for a lock that backend ``pid`` holds."""
    with side.connect() as c:
        q = "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
        return bool(c.execute(sa.text(q), {"pid": pid}).scalar_one())


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_lease_is_not_taken_over_between_the_outcomes_check_and_its_writes(
    make_engine: MakeEngine, database_url: str
) -> None:
    """PostgreSQL (SQLite's writers take turns): the outcome's transaction checks the lease
    in its first round trip and writes after it. Neither the reaper nor a claim takes the run
    lock that transaction holds, so if the check only read the job row, a reap of the expired
    lease and worker B's claim could commit in between, and the outcome would still be
    recorded (deleting the job B had just claimed). Staged without timing: another connection
    holds the stage row, so the outcome's transaction waits there, past its check, while the
    reaper and B's claim run; the check must hold the job row until the outcome commits."""
    gates = Gates()
    wf = Workflow("lost-lease-check-race", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> str:
        return f"call-{await gates.pass_()}"

    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    [job_a] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # A runs the body, and stalls
    await _expire(engine, job_a.id)  # A's lease runs out; the reaper has not come yet
    side = sa.create_engine(database_url, poolclass=sa.NullPool)
    try:
        with side.connect() as holder:
            row = stages.c.run_id == run.id, stages.c.stage_id == "s"
            holder.execute(sa.select(stages.c.status).where(*row).with_for_update())
            pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            gates.open[0].set()  # A returns: its outcome checks the lease, then waits here

            async def waiting() -> bool:
                return _blocking(side, pid)

            await eventually(waiting)
            with side.begin() as c:  # meanwhile the reaper, then worker B's claim
                reaped = [r.id for r in _jobs.reap_stale(c, kernel.now())]
                claimed = [j.id for j in _jobs.claim(c, "worker-b", None, 1, 60.0, kernel.now())]
            holder.rollback()
        result = await _settle(a)
    finally:
        side.dispose()
    # the reaper skipped the job whose lease the outcome's transaction held, and nothing was
    # due for B: the outcome was recorded under a lease nobody took over
    assert (reaped, claimed, result) == ([], [], "completed"), (
        "the lease was taken over between the outcome's check and its writes"
    )
    info = await engine.get_run(run.id)
    assert (info.status, info.output) == ("completed", "call-0")
    assert types(await engine.events(run.id), "s") == ["stage.started", "stage.completed"]
    assert await kernel.dispatch(ClaimPending("worker-b", limit=1)) == []


def _saga(name: str, gates: Gates) -> Workflow[In]:
    """Stage a completes, stage b fails for good: a's compensation (no step: recording it is
    its only write) waits at the next gate."""
    wf = Workflow(name, input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        return "reserved"

    @a.compensation
    async def release(ctx: StageContext[In], output: str) -> None:
        await gates.pass_()

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        raise NonRetryableError("out of stock")

    return wf


async def _compensating(engine: NativeEngine, worker: str) -> Any:
    """Run the saga's stages (a completes, b fails); the compensation job claimed by
    ``worker``."""
    kernel = engine.kernel
    for _ in range(2):
        [job] = await kernel.dispatch(ClaimPending(worker, limit=1))
        await kernel.dispatch(ExecuteJob(job, worker))
    [job] = await kernel.dispatch(ClaimPending(worker, limit=1))
    assert job.kind == "compensate"
    return job


async def _compensated_once(engine: NativeEngine, run_id: str) -> None:
    info = await engine.get_run(run_id)
    assert info.status == "failed"
    assert info.stage("a").status == "compensated"
    assert types(await engine.events(run_id), "a").count("stage.compensated") == 1


@TAKERS
async def test_a_taken_over_compensation_does_not_record_it(
    make_engine: MakeEngine, taker: str
) -> None:
    gates = Gates()
    wf = _saga("lost-lease-saga-record", gates)
    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    job_a = await _compensating(engine, "worker-a")
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # A compensates stage a, and stalls
    await _expire_and_reap(engine, job_a.id)
    [job_b] = await kernel.dispatch(ClaimPending(taker, limit=1))
    b = asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, taker)))
    await asyncio.wait_for(gates.entered[1].wait(), 10)  # B compensates stage a too
    gates.open[0].set()
    assert await _settle(a) == "discarded"
    stage_a = (await engine.get_run(run.id)).stage("a")
    assert stage_a.status == "completed", "the stale compensation was recorded"
    gates.open[1].set()
    assert await _settle(b) == "compensated"
    await _compensated_once(engine, run.id)


@pytest.mark.parametrize("taker", [None, "worker-a"], ids=["reaped", "itself"])
async def test_a_compensation_stops_when_its_heartbeat_finds_the_lease_gone(
    make_engine: MakeEngine, taker: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """As a stage attempt does: the heartbeat that finds the lease gone (reaped; or claimed
    again, by this very worker) cancels the compensation and says so; it records nothing."""
    gates = Gates()
    wf = _saga("lost-lease-saga-beat", gates)
    engine = await make_engine(wf, **BEATING)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    job_a = await _compensating(engine, "worker-a")
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # A compensates stage a, and stalls
    job_b = await take_over(engine, job_a.id, taker)
    assert await _settle(a) == "discarded"  # (its gate never opened: the heartbeat stopped it)
    assert "no longer holds its lease" in caplog.text
    assert (await engine.get_run(run.id)).stage("a").status == "completed"
    if job_b is None:
        taker = "worker-b"
        [job_b] = await kernel.dispatch(ClaimPending(taker, limit=1))
    assert taker is not None
    gates.open[1].set()
    b = asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, taker)))
    assert await _settle(b) == "compensated"
    assert gates.calls == 2
    await _compensated_once(engine, run.id)


async def test_a_stage_attempt_stops_when_its_own_worker_claimed_the_job_again(
    make_engine: MakeEngine,
) -> None:
    """The stalled attempt's heartbeat finds the job leased to its worker under a later
    claim: not its lease; the attempt is stopped and its outcome discarded."""
    gates = Gates()
    wf = Workflow("lost-lease-beat", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> str:
        return f"call-{await gates.pass_()}"

    engine = await make_engine(wf, **BEATING)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    [job_a] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    a = asyncio.create_task(kernel.dispatch(ExecuteJob(job_a, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)
    job_b = await take_over(engine, job_a.id, "worker-a")
    assert await _settle(a) == "discarded"  # (its gate never opened: the heartbeat stopped it)
    gates.open[1].set()
    assert await _settle(asyncio.create_task(kernel.dispatch(ExecuteJob(job_b, "worker-a")))) == (
        "completed"
    )
    info = await engine.get_run(run.id)
    assert (info.status, info.output) == ("completed", "call-1")


async def test_a_stale_claim_neither_renews_nor_gives_back_its_workers_new_claim(
    make_engine: MakeEngine,
) -> None:
    wf = Workflow("lost-lease-give-back", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> int:
        return 1

    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    await engine.start(wf.id, {"n": 1})
    [old] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    new = await take_over(engine, old.id, "worker-a")
    later = kernel.now() + 1
    assert not await kernel.db.tx(_progress.abandon_job, old, "worker-a", later)
    assert await kernel.dispatch(Heartbeat(old.id, "worker-a", old.lease_token)) == (False, True)
    assert await kernel.dispatch(ReleaseJobs((old.id,), "worker-a", (old.lease_token,))) == 0
    row = await _job_row(engine, old.id)
    assert (row.status, row.lease_owner, row.lease_token) == ("leased", "worker-a", new.lease_token)
    # the new claim's own
    assert await kernel.dispatch(Heartbeat(new.id, "worker-a", new.lease_token)) == (True, False)
    assert await kernel.dispatch(ReleaseJobs((new.id,), "worker-a", (new.lease_token,))) == 1
    assert (await _job_row(engine, new.id)).status == "ready"


async def _job_row(engine: NativeEngine, job_id: int) -> Any:
    def q(conn: sa.Connection) -> Any:
        return conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one()

    return await engine.kernel.db.read(q)


async def test_a_compensation_waits_for_a_stage_whose_lease_was_taken_back(
    make_engine: MakeEngine,
) -> None:
    """A run cancelled while stage s runs compensates once s is stopped. If s's worker stalls
    and its lease is taken back before anyone claims it again, s's job is 'ready', not
    'leased': the compensation used to count only leased jobs as busy, went ahead, and
    ended the run cancelled with s still 'running' (and no stage.cancelled)."""
    gates = Gates()
    wf = Workflow("lost-lease-cancel", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        return "held"

    @a.compensation
    async def unhold(ctx: StageContext[In], output: str) -> None:
        return None

    @wf.stage(after=[a])
    async def s(ctx: StageContext[In]) -> str:
        return f"call-{await gates.pass_()}"

    engine = await make_engine(wf, **SETTINGS)
    kernel = engine.kernel
    run = await engine.start(wf.id, {"n": 1})
    [job] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    await kernel.dispatch(ExecuteJob(job, "worker-a"))  # a completes
    [job_s] = await kernel.dispatch(ClaimPending("worker-a", limit=1))
    assert job_s.stage_id == "s"
    s_task = asyncio.create_task(kernel.dispatch(ExecuteJob(job_s, "worker-a")))
    await asyncio.wait_for(gates.entered[0].wait(), 10)  # s runs, and stalls
    await kernel.dispatch(CancelRun(run.id))
    assert (await engine.get_run(run.id)).status == "compensating"
    [comp] = await kernel.dispatch(ClaimPending("worker-b", limit=1))
    assert comp.kind == "compensate"
    await _expire_and_reap(engine, job_s.id)  # s's job is ready again, its stage running
    await kernel.dispatch(ExecuteJob(comp, "worker-b"))
    for _ in range(4):  # claim and run whatever is due: s's job, the compensation again
        for due in await kernel.dispatch(ClaimPending("worker-b", limit=1)):
            await kernel.dispatch(ExecuteJob(due, "worker-b"))
        if (await engine.get_run(run.id)).status == "cancelled":
            break
    gates.open[0].set()
    assert await _settle(s_task) == "discarded"
    info = await engine.get_run(run.id)
    assert info.status == "cancelled"
    assert info.stage("s").status == "cancelled", "the run ended with stage s still running"
    assert info.stage("a").status == "compensated"
