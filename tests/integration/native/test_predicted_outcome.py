"""A stage outcome predicted from what its begin read (PostgreSQL, issue 12): the guards, the
writes and the COMMIT in one round trip, with the same rows and events as the outcome
recorded after reading; when the run moved between the begin and the outcome (cancelled, the
lease taken over) the guard fails the transaction and the outcome is recorded the slow way,
as it would have been without the prediction. On SQLite nothing is predicted: the same
results, from the same code path as before."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import ClaimPending, NativeEngine, Transition, _progress
from driver_native._progress import Begin, Handoff
from driver_native._schema import jobs, runs, stages
from engine_port import Completed, ErrorInfo, Failed, Lifecycle

from . import workflows as w
from .conftest import MakeEngine
from .stalls import take_over


@pytest.fixture
def guard_failures(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The outcomes (``run_id/stage_id``) whose guard found the prediction wrong."""
    failed: list[str] = []
    original = _progress.guard_failed

    def counting(exc: BaseException) -> bool:
        found = original(exc)
        if found:
            failed.append("guard")
        return found

    monkeypatch.setattr(_progress, "guard_failed", counting)
    return failed


async def _record(
    engine: NativeEngine, job: Any, worker: str, outcome: Any, begun: Begin | None
) -> tuple[str, Handoff]:
    """The outcome as the worker records it (``begun`` None: without a prediction)."""
    handoff = Handoff(worker, 30.0, 1)
    transition = Transition(job, worker, outcome)
    result, _ = await engine.kernel._record(transition, handoff, False, None, begun)
    return result, handoff


async def _events(engine: NativeEngine, run_id: str) -> list[tuple[str, str | None, Any]]:
    """The run's events (type, stage, data: comparable across runs), each id checked against
    the one its lifecycle gives (ids are derived from the run's)."""
    events = await engine.events(run_id)
    life = Lifecycle(run_id)
    made = {
        "run.created": lambda e: life.run_created(e.data["version"]),
        "run.started": lambda e: life.run_started(),
        "stage.started": lambda e: life.stage_started(e.stage, e.data["attempt"]),
        "stage.completed": lambda e: life.stage_completed(e.stage, e.data["attempt"]),
        "stage.cancelled": lambda e: life.stage_cancelled(e.stage),
        "run.completed": lambda e: life.run_completed(),
    }
    for e in events:
        if e.type in made:
            assert e.id == made[e.type](e).id, e
    return [(e.type, e.stage, e.data) for e in events]


async def _linear_run(
    engine: NativeEngine, predicted: bool
) -> tuple[str, list[str], list[int | None]]:
    """it-linear through its three outcomes, each stage handed on by the one before."""
    run = await engine.start(w.linear, {"n": 1})
    [(job, begun)] = await engine.kernel.dispatch(ClaimPending("w1", limit=1, begin=True))
    results = []
    for output in (2, 4, {"result": 5}):
        result, handoff = await _record(
            engine, job, "w1", Completed(output), begun if predicted else None
        )
        results.append(result)
        if handoff.jobs:
            [(job, begun)] = handoff.jobs
    return run.id, results, [begun.seen is not None]


async def test_a_predicted_chain_writes_what_the_read_one_writes_in_one_round_trip(
    make_engine: MakeEngine, round_trips: dict[str, list[int]], guard_failures: list[str]
) -> None:
    engine = await make_engine(w.linear)
    slow_id, slow, _ = await _linear_run(engine, predicted=False)
    slow_trips = list(round_trips.get("_apply_and_read", []))
    round_trips.clear()
    fast_id, fast, _ = await _linear_run(engine, predicted=True)
    assert slow == fast == ["completed"] * 3
    assert await _events(engine, fast_id) == await _events(engine, slow_id)
    fast_run, slow_run = await engine.get_run(fast_id), await engine.get_run(slow_id)
    assert fast_run.status == slow_run.status == "completed"
    assert fast_run.output == slow_run.output == {"result": 5}
    assert [s.model_dump(exclude={"started_at", "finished_at"}) for s in fast_run.stages] == [
        s.model_dump(exclude={"started_at", "finished_at"}) for s in slow_run.stages
    ]
    assert await engine.kernel.db.read(lambda c: c.execute(sa.select(jobs.c.id)).all()) == []
    assert guard_failures == []
    if engine.kernel.db.is_postgres:
        assert slow_trips == [2, 2, 2]
        assert round_trips["_apply_and_read"] == [1, 1, 1]


async def test_a_failure_retried_is_predicted(
    make_engine: MakeEngine, round_trips: dict[str, list[int]], guard_failures: list[str]
) -> None:
    engine = await make_engine(w.linear)
    await engine.start(w.linear, {"n": 1})
    [(job, begun)] = await engine.kernel.dispatch(ClaimPending("w1", limit=1, begin=True))
    error = ErrorInfo(type="Boom", message="again")
    result, _ = await _record(engine, job, "w1", Failed(error, retryable=True), begun)
    assert result == "retrying"
    assert guard_failures == []
    if engine.kernel.db.is_postgres:
        assert round_trips["_apply_and_read"] == [1]


async def _cancelled_between(engine: NativeEngine, predicted: bool) -> tuple[str, str]:
    run = await engine.start(w.linear, {"n": 1})
    [(job, begun)] = await engine.kernel.dispatch(ClaimPending("w1", limit=1, begin=True))
    # a cancel commits while the stage runs (its worker settles the stage at its outcome)
    await engine.kernel.db.tx(
        lambda c: c.execute(
            sa.update(runs).where(runs.c.id == run.id).values(cancel_requested=True)
        )
    )
    result, handoff = await _record(engine, job, "w1", Completed(2), begun if predicted else None)
    assert handoff.jobs == [] and not handoff.finished
    return run.id, result


async def test_a_run_cancelled_after_the_begin_fails_the_guard_and_is_recorded_as_before(
    make_engine: MakeEngine, guard_failures: list[str]
) -> None:
    engine = await make_engine(w.linear)
    slow_id, slow = await _cancelled_between(engine, predicted=False)
    assert guard_failures == []
    fast_id, fast = await _cancelled_between(engine, predicted=True)
    assert slow == fast == "cancelled"
    assert guard_failures == (["guard"] if engine.kernel.db.is_postgres else [])
    assert await _events(engine, fast_id) == await _events(engine, slow_id)
    assert [e[0] for e in await _events(engine, fast_id) if e[1] == "a"] == [
        "stage.started",
        "stage.cancelled",
    ]
    fast_run, slow_run = await engine.get_run(fast_id), await engine.get_run(slow_id)
    assert [s.status for s in fast_run.stages] == [s.status for s in slow_run.stages]


async def test_a_lease_taken_over_after_the_begin_fails_the_guard_and_is_discarded(
    make_engine: MakeEngine, guard_failures: list[str]
) -> None:
    engine = await make_engine(w.linear)
    await _linear_run(engine, predicted=False)  # (its outcomes reserve job ids ahead)
    run = await engine.start(w.linear, {"n": 1})
    [(job, begun)] = await engine.kernel.dispatch(ClaimPending("w1", limit=1, begin=True))
    # the same worker's later claim: only the claim token tells the attempts apart
    taken = await take_over(engine, job.id, "w1")
    result, handoff = await _record(engine, job, "w1", Completed(2), begun)
    assert result == "discarded" and handoff.jobs == []
    assert guard_failures == (["guard"] if engine.kernel.db.is_postgres else [])

    def rows(conn: sa.Connection) -> Any:
        return conn.execute(
            sa.select(stages.c.stage_id, stages.c.status).where(stages.c.run_id == run.id)
        ).all()

    assert sorted(await engine.kernel.db.read(rows)) == [
        ("a", "running"),
        ("b", "pending"),
        ("c", "pending"),
    ]
    # the new owner records its own outcome (the slow way: its attempt was not begun here)
    assert (await _record(engine, taken, "w1", Completed(2), None))[0] == "completed"
