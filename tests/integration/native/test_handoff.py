"""A run started next to a local worker goes to it without the queue: the run is created,
leased to the worker and begun in one transaction, each stage hands the next one on in the
transaction that records it, and wait() learns of the end from the worker (issue 12)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import _kernel
from driver_native._db import Database
from driver_native._schema import signals
from engine_port import Lifecycle, StageContext, Workflow

from . import workflows as w
from .conftest import MakeEngine, eventually


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Autocommit reads by the name of their function."""
    seen: Counter[str] = Counter()
    original = Database._read_once

    def counting(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        seen[getattr(fn, "__name__", repr(fn))] += 1
        return original(self, attempt, fn, *a, **k)

    monkeypatch.setattr(Database, "_read_once", counting)
    return seen


@pytest.fixture
def idle(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The worker's claims that found nothing. Its own look for queued work (woken by the
    end of a run before, or by its poll) may come after a test cleared its counters on a
    busy machine (the suite beside another): it is not the cost of the run measured (a claim
    that took the run's job would be)."""
    seen: Counter[str] = Counter()
    claim = _kernel._claim_and_begin

    @functools.wraps(claim)
    def counted(*args: Any, **kwargs: Any) -> Any:
        got = claim(*args, **kwargs)
        if not got:
            seen["_claim_and_begin"] += 1
        return got

    monkeypatch.setattr(_kernel, "_claim_and_begin", counted)
    return seen


async def _first_maintenance_done(host: Any) -> None:
    """The worker loop's first maintenance (its reads and transactions) is over."""
    for _ in range(500):
        if host._next_survey:  # (set when the first survey is over)
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the worker never ran its maintenance")


async def test_a_three_stage_run_with_a_local_worker_costs_four_transactions(
    make_engine: MakeEngine,
    transactions: Counter[str],
    reads: Counter[str],
    round_trips: dict[str, list[int]],
    idle: Counter[str],
) -> None:
    engine = await make_engine(w.linear)
    async with engine.worker(maintenance_interval=3600) as host:
        warm = await engine.start(w.linear, {"n": 0})
        assert (await engine.wait(warm.id, timeout=30)).status == "completed"
        await _first_maintenance_done(host)
        transactions.clear()
        reads.clear()
        round_trips.clear()
        run = await engine.start(w.linear, {"n": 1})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed" and info.output == {"result": 5}
    assert [s.status for s in info.stages] == ["completed"] * 3
    assert info.finished_at is not None and info.input["n"] == 1
    # create (+ lease + begin the first stage), then one per stage outcome: no claim, no begin
    ran = transactions - idle
    assert ran == Counter({"_create_run_once": 1, "_apply_and_read": 3}), (transactions, idle)
    if engine.kernel.db.is_postgres:  # (3 and 4, 4, 6 before issue 12's "npg" changes)
        # (the last: its final read goes out with the COMMIT; the create reads nothing first:
        # its first stage's job id was reserved by the warm-up's, the drain is checked by its
        # first statement; 2 before). Each outcome is predicted from what its stage's begin
        # read: guards, writes and COMMIT in one round trip (2 each before: reads, then
        # writes and COMMIT)
        trips = {k: v for k, v in round_trips.items() if k not in idle}
        assert trips == {"_create_run_once": [1], "_apply_and_read": [1, 1, 1]}, dict(round_trips)
    # wait() returns the state the last transition read: no read of the run after its end
    assert set(reads) <= {"next_due"}, reads  # (only the idle worker's own look for work)
    assert info == await engine.get_run(run.id)
    # the same events as through the queue, in the same order
    lc = Lifecycle(run.id)
    types = [e.type for e in await engine.events(run.id)]
    assert types[:3] == ["run.created", "run.started", "stage.started"]
    assert types[-1] == "run.completed"
    assert lc.run_started().id == (await engine.events(run.id))[1].id


gated = Workflow("it-gated-waiter", input=w.Item)


@gated.stage
async def prep(ctx: StageContext[w.Item]) -> str:
    return "prepped"


@gated.stage(after=[prep], after_signal="go")
async def wait_go(ctx: StageContext[w.Item]) -> dict[str, Any]:
    return {"got": await ctx.step.wait_for_signal("go")}


@pytest.mark.parametrize("wf", [w.waiter, gated], ids=["wait-in-body", "after-signal"])
async def test_a_signal_hands_the_stage_it_wakes_to_the_local_worker(
    make_engine: MakeEngine,
    transactions: Counter[str],
    reads: Counter[str],
    round_trips: dict[str, list[int]],
    idle: Counter[str],
    wf: Workflow[w.Item],
) -> None:
    """signal() -> completion with a worker in this process: the signal's transaction leases
    and begins the woken stage (no wake-up, due-jobs look or claim) and its wait takes the
    signal there (no transaction of its own when the stage replays), the stage's outcome ends
    the run and wait() needs no read: two transactions. The same for a stage that starts on
    the signal (``after_signal``), whose gate journals nothing while it waits: the signal's
    transaction journals the gate's step (until 2026-12-06 the resumed gate took the signal
    in a third transaction)."""
    engine = await make_engine(wf)
    async with engine.worker(maintenance_interval=3600, poll_interval=30) as host:
        run = await engine.start(wf, {"n": 1})
        for _ in range(500):
            info = await engine.get_run(run.id)
            if any(s.status == "suspended" for s in info.stages):
                break
            await asyncio.sleep(0.01)
        await _first_maintenance_done(host)
        await asyncio.sleep(0.05)  # (the worker goes idle after the suspension)
        transactions.clear()
        reads.clear()
        round_trips.clear()
        await engine.signal(run.id, "go", {"ok": True})
        done = await engine.wait(run.id, timeout=30)
    assert done.status == "completed" and done.output == {"got": {"ok": True}}
    # (a third, _consume, before the wait took the signal in the signal's transaction)
    ran = transactions - idle
    assert ran == Counter({"_signal_and_begin": 1, "_apply_and_read": 1}), (transactions, idle)
    if engine.kernel.db.is_postgres:  # (9, 3, 5 before issue 12's "npg" changes; then 5, 2, 3)
        # the run locked with the signal counts; the signal's insert, the wake and the lease
        # with the resumed stage's row, steps and upstream outputs (read ahead: 4 until
        # 2026-12-04); the outcome predicted from that begin: guards, writes and COMMIT in
        # one round trip (2 before: reads, then the writes with the COMMIT)
        trips = {k: v for k, v in round_trips.items() if k not in idle}
        assert trips == {"_signal_and_begin": [3], "_apply_and_read": [1]}, dict(round_trips)
    assert set(reads) <= {"next_due"}, reads  # (only the idle worker's own look for work)
    assert host.stats()["handed_off"] == 3  # prep at start, wait_go by prep, the resume
    steps = await engine.steps(run.id)
    assert [(s.name, s.kind, s.completed) for s in steps if s.stage == "wait_go"] == [
        ("go", "signal", True)
    ]
    consumed = await engine.kernel.db.read(
        lambda c: c.execute(sa.select(signals.c.consumed).where(signals.c.run_id == run.id)).all()
    )
    assert [r.consumed for r in consumed] == [True]


twins = Workflow("it-twin-waits", input=w.Item)


@twins.stage
async def seed(ctx: StageContext[w.Item]) -> int:
    return ctx.input.n


@twins.stage(after=[seed])
async def left(ctx: StageContext[w.Item]) -> dict[str, Any]:
    return {"seed": ctx.output_of("seed"), "got": await ctx.step.wait_for_signal("go")}


@twins.stage(after=[seed])
async def right(ctx: StageContext[w.Item]) -> dict[str, Any]:
    return {"seed": ctx.output_of("seed"), "got": await ctx.step.wait_for_signal("go")}


async def test_two_stages_waiting_for_one_name_each_resume_with_their_own_signal(
    make_engine: MakeEngine,
) -> None:
    """A signal wakes every wait for its name; the local worker is handed the first woken
    stage (its reads sent ahead with the lease) and the other goes back to waiting for the
    next signal, which is handed the same way: each stage gets one signal, with its upstream
    output, and none is lost."""
    engine = await make_engine(twins)
    async with engine.worker(poll_interval=0.05) as host:
        run = await engine.start(twins, {"n": 7})

        async def both_waiting() -> bool:
            info = await engine.get_run(run.id)
            return sum(s.status == "suspended" for s in info.stages) == 2

        await eventually(both_waiting, timeout=30)
        first = await engine.signal(run.id, "go", {"k": 1})
        second = await engine.signal(run.id, "go", {"k": 2})
        done = await engine.wait(run.id, timeout=30)
        assert host.stats()["handed_off"] >= 4  # seed, left, right at start; then a resume
    assert first.delivered and done.status == "completed", done
    outputs = {s.id: s.output for s in done.stages}
    assert outputs["left"]["seed"] == outputs["right"]["seed"] == 7
    assert sorted([outputs["left"]["got"]["k"], outputs["right"]["got"]["k"]]) == [1, 2]
    assert second.name == "go"


_SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("wfe_test_seen", default="unset")


async def test_a_stage_handed_on_does_not_see_what_the_previous_stage_set_in_its_context(
    make_engine: MakeEngine,
) -> None:
    """A context variable a stage body sets stays in that body (it runs in a task of its
    own, ``StageRunner._bounded``), also now that the attempt around it runs in its job's
    task: the stage it hands on to this worker does not see it."""
    wf = Workflow("ctx-handoff", input=w.Item)
    seen: list[str] = []

    @wf.stage
    async def first(ctx: StageContext[Any]) -> int:
        seen.append(_SEEN.get())
        _SEEN.set("first")
        return 1

    @wf.stage(after=[first])
    async def second(ctx: StageContext[Any]) -> int:
        seen.append(_SEEN.get())
        _SEEN.set("second")
        return 2

    @wf.stage(after=[second])
    async def third(ctx: StageContext[Any]) -> int:
        seen.append(_SEEN.get())
        return 3

    engine = await make_engine(wf)
    async with engine.worker() as host:
        run = await engine.start(wf, {})
        info = await engine.wait(run.id, timeout=30)
        assert host.stats()["handed_off"] >= 3  # (each stage went straight to the worker)
    assert info.status == "completed"
    assert seen == ["unset", "unset", "unset"]
    assert _SEEN.get() == "unset"
