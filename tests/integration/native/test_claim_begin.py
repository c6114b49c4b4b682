"""``ClaimPending(begin=True)`` (what the worker host sends): a claimed stage attempt is begun
in the claiming transaction, one transaction per claimed job fewer, with the same rows and
events as a claim followed by ``begin_attempt``; a stage that must not run is settled there."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from driver_native import ClaimPending, ExecuteJob, NativeEngine
from driver_native._commands import SKIPPED
from driver_native._progress import Begin
from driver_native._schema import jobs, runs
from engine_port import RunStatus

from .conftest import MakeEngine, types


async def test_a_claimed_stage_is_begun_in_the_claim(make_engine: MakeEngine) -> None:
    engine: NativeEngine = await make_engine()
    kernel = engine.kernel
    run = await engine.start("it-linear", {"n": 1})  # no worker: its first job is queued
    [(job, begun)] = await kernel.dispatch(ClaimPending("w1", limit=5, begin=True))
    assert isinstance(begun, Begin)
    assert (begun.run_id, begun.stage_id, begun.attempt) == (run.id, "a", 1)
    info = await engine.get_run(run.id)
    assert info.status == RunStatus.RUNNING
    assert [s.status for s in info.stages] == ["running", "pending", "pending"]
    assert types(await engine.events(run.id)) == ["run.created", "run.started", "stage.started"]
    # the job runs from there without a begin of its own (and hands b, c on to itself)
    handed: list[tuple[object, object]] = []
    result = await kernel.dispatch(
        ExecuteJob(job, "w1", begun=begun, handoff=1, on_handoff=handed.extend)
    )
    assert result == "completed"
    assert types(await engine.events(run.id), "a") == ["stage.started", "stage.completed"]


async def test_a_claimed_stage_of_a_stopping_run_is_settled_not_run(
    make_engine: MakeEngine,
) -> None:
    """The claim finds the run stopping (its cancel committed while the job was still
    queued, as ``begin_attempt`` handles it): the job is dropped there and nothing runs."""
    engine: NativeEngine = await make_engine()
    kernel = engine.kernel
    run = await engine.start("it-linear", {"n": 1})
    await kernel.db.tx(
        lambda c: c.execute(
            sa.update(runs).where(runs.c.id == run.id).values(cancel_requested=True)
        )
    )
    claimed = await kernel.dispatch(ClaimPending("w1", limit=5, begin=True))
    assert [(j.stage_id, begun) for j, begun in claimed] == [("a", SKIPPED)]
    assert await kernel.db.read(lambda c: c.execute(sa.select(jobs.c.id)).all()) == []
    assert [s.status for s in (await engine.get_run(run.id)).stages] == ["pending"] * 3
    assert "stage.started" not in types(await engine.events(run.id))


async def test_a_claim_begins_the_siblings_of_a_fan_out_in_one_round_trip(
    make_engine: MakeEngine, round_trips: dict[str, list[int]]
) -> None:
    """Issue 12 (npg2): a claim of several siblings of one run locks the run once and reads
    their stage rows and upstream outputs in one pipeline: 3 round trips (the claim, that
    pipeline, the writes with the COMMIT) however many it takes; before, two more per job
    (the run lock with the stage row, then the outputs), 22 for 10 siblings."""
    from .test_wide_graphs import fan

    wf = fan(12)
    engine: NativeEngine = await make_engine(wf)
    if not engine.kernel.db.is_postgres:
        pytest.skip("SQLite has no network round trips")
    kernel = engine.kernel
    run = await engine.start(wf.id, {})
    [(job, begun)] = await kernel.dispatch(ClaimPending("w1", limit=5, begin=True))
    assert await kernel.dispatch(ExecuteJob(job, "w1", begun=begun)) == "completed"
    round_trips.clear()
    claimed = await kernel.dispatch(ClaimPending("w1", limit=10, begin=True, probe=False))
    assert len(claimed) == 10
    assert dict(round_trips) == {"_claim_and_begin": [3]}, dict(round_trips)
    for _job, begun in claimed:
        assert isinstance(begun, Begin)
        assert (begun.run_id, begun.attempt, begun.outputs) == (run.id, 1, {"src": 1})
    statuses = {s.id: s.status for s in (await engine.get_run(run.id)).stages}
    assert sorted(s for s, v in statuses.items() if v == "running") == sorted(
        j.stage_id for j, _ in claimed
    )
    events = await engine.events(run.id)
    assert types(events).count("stage.started") == 11  # src and the ten, once each
    # they run from there, and the rest are claimed and the run completes
    for job, begun in claimed:
        assert await kernel.dispatch(ExecuteJob(job, "w1", begun=begun)) == "completed"
    while rest := await kernel.dispatch(ClaimPending("w1", limit=10, begin=True)):
        for job, begun in rest:
            assert await kernel.dispatch(ExecuteJob(job, "w1", begun=begun)) == "completed"
    info = await engine.get_run(run.id)
    assert (info.status, info.output) == (RunStatus.COMPLETED, 12 * 2 + 1)
