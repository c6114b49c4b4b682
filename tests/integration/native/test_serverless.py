"""Serverless host: a queue consumer and a cron loop written exactly as the seed's examples,
on SQLite and PostgreSQL, with no WorkerHost."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import (
    ClaimPending,
    CreateRun,
    HandleJobResult,
    JobMessage,
    ReleaseJobs,
    _schema,
    handle_job,
    job_message,
    process_available_jobs,
    run_maintenance_tick,
    run_to_completion,
)
from driver_native._engine import NativeEngine
from engine_port import FakeClock, MemorySink
from engine_port.errors import InvalidInputError, RunExistsError

from . import workflows as w
from .conftest import MakeEngine, eventually, types

SEED_TICK_KEYS = {
    "claimed",
    "suspendedChecked",
    "staleReleased",
    "eventsFlushed",
    "stuckReaped",
    "purged",
    "eventsFailed",
    "eventsDeadLettered",
    "eventSinkStatus",
    "eventSinkError",
}


async def _jobs_of(engine: NativeEngine, run_id: str) -> list[Any]:
    def q(conn: sa.Connection) -> list[Any]:
        t = _schema.jobs
        return list(conn.execute(sa.select(t).where(t.c.run_id == run_id).order_by(t.c.id)))

    return await engine.kernel.db.tx(q)


@dataclass
class Msg:
    """A message of a push queue (Cloudflare Queues / SQS): a body, acked or retried."""

    id: int
    body: Any
    visible_at: float = 0.0


@dataclass
class FakeQueue:
    """At-least-once delivery with ``retry(delay_seconds)`` re-delivery, like the seed's."""

    messages: list[Msg] = field(default_factory=list)
    acked: list[tuple[Any, HandleJobResult]] = field(default_factory=list)
    retried: list[tuple[Any, HandleJobResult, int]] = field(default_factory=list)
    _ids: int = 0

    def send(self, body: Any, delay_seconds: float = 0.0) -> None:
        self._ids += 1
        self.messages.append(Msg(self._ids, body, time.monotonic() + delay_seconds))

    def batch(self) -> list[Msg]:
        now = time.monotonic()
        due = [m for m in self.messages if m.visible_at <= now]
        self.messages = [m for m in self.messages if m.visible_at > now]
        return due


async def _consume(engine: NativeEngine, queue: FakeQueue) -> None:
    """The seed's queue handler, in Python: ack / retry with the returned delay / ack dead."""
    for msg in queue.batch():
        result = await handle_job(engine.kernel, msg.body)
        if result.outcome in ("completed", "suspended"):
            queue.acked.append((msg.body, result))
        elif result.will_retry and not result.dead:
            delay = math.ceil((result.retry_delay_ms or 0) / 1000)
            queue.retried.append((msg.body, result, delay))
            queue.send(msg.body, delay_seconds=delay)
        else:  # terminal, or dead: already failed and acknowledged
            queue.acked.append((msg.body, result))
        # the producer side: every job the outcome made due becomes a message
        for job_id in result.ready_job_ids:
            queue.send(JobMessage(job_id=job_id).model_dump(by_alias=True))


async def test_queue_consumer_acks_retries_and_acks_dead(make_engine: MakeEngine) -> None:
    sink = MemorySink()
    engine = await make_engine(w.linear, w.flaky, event_sink=sink)
    queue = FakeQueue()
    ok = await engine.start("it-linear", {"n": 1})
    bad = await engine.start("it-flaky", {"n": 1})
    for run in (ok, bad):
        for job in await _jobs_of(engine, run.id):
            # the seed's message, as JSON with camelCase keys
            queue.send(job_message(job).model_dump_json(by_alias=True))
    queue.send({"jobId": "not a number"})  # malformed: acked as dead, never retried
    queue.send({"job_id": 99_999})  # an orphan: acked as dead

    async def drained() -> bool:
        await _consume(engine, queue)
        return not queue.messages

    await eventually(drained, timeout=20, interval=0.05)
    assert (await engine.get_run(ok.id)).status == "completed"
    failed = await engine.get_run(bad.id)
    assert failed.status == "failed" and failed.stage("first").status == "compensated"

    # boom failed once with attempts left: retried after its backoff (1 s), then failed for
    # good and acked; nothing else was retried
    ((_, retry, delay),) = queue.retried
    assert (retry.outcome, retry.will_retry, retry.dead) == ("failed", True, False)
    assert (retry.stage_id, retry.attempt, retry.max_attempts, delay) == ("boom", 1, 2, 1)
    assert retry.error is not None
    results = [r for _, r in queue.acked]
    final = [r for r in results if r.stage_id == "boom"]
    assert [(r.outcome, r.will_retry, r.dead, r.attempt) for r in final] == [
        ("failed", False, False, 2)
    ]
    dead = [r for r in results if r.dead]
    assert sorted(r.detail for r in dead) == ["gone", "malformed"]
    assert all(r.outcome == "failed" and not r.will_retry for r in dead)
    assert "jobId" in (dead[0].error or "") + (dead[1].error or "")
    completed = [r for r in results if r.outcome == "completed"]
    assert sorted((r.kind, r.stage_id) for r in completed) == [
        ("compensate", "*"),  # the run's compensation job
        ("stage", "a"),
        ("stage", "b"),
        ("stage", "c"),
        ("stage", "first"),
    ]
    # flushOutboxAfterJob: the last job's events reached the sink with no maintenance tick
    assert types(sink.for_run(ok.id))[-1] == "run.completed"
    assert types(sink.for_run(bad.id))[-1] == "run.failed"
    # the seed's camelCase keys
    assert set(retry.model_dump(by_alias=True)) >= {
        "outcome",
        "error",
        "dead",
        "willRetry",
        "attempt",
        "maxAttempts",
        "retryDelayMs",
    }


async def test_handle_job_busy_stale_and_claimed(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear)
    k = engine.kernel
    run = await engine.start("it-linear", {"n": 1})
    (job,) = await _jobs_of(engine, run.id)
    # a message whose ids contradict the row is dead, and runs nothing
    stale = await handle_job(k, {"jobId": job.id, "workflowRunId": "someone-else"})
    assert (stale.dead, stale.detail) == (True, "mismatch") and w.COUNTS["a"] == 0
    # a huge contradicting field is not copied whole into the error (and the log line)
    huge = await handle_job(k, {"jobId": job.id, "stageId": "s" * 100_000})
    assert (huge.dead, huge.detail) == (True, "mismatch") and huge.error is not None
    assert len(huge.error) < 1_000, len(huge.error)
    # `true` is not job 1, nor attempt 1: dead and malformed, nothing runs (a queue's string
    # id is a number: the seed's Cloudflare consumer sends msg.id)
    for flag in ({"jobId": True}, {"jobId": job.id, "attempt": True}):
        wrong = await handle_job(k, flag)
        assert (wrong.dead, wrong.detail) == (True, "malformed") and w.COUNTS["a"] == 0
    (claimed,) = await k.dispatch(ClaimPending("other-fn", limit=1))
    busy = await handle_job(k, {"jobId": str(job.id)})
    # leased elsewhere: re-deliver when that lease ends (never lost, never run twice)
    assert (busy.outcome, busy.will_retry, busy.dead, busy.detail) == (
        "failed",
        True,
        False,
        "busy",
    )
    assert busy.retry_delay_ms is not None and busy.retry_delay_ms > 0 and not busy.ack
    assert w.COUNTS["a"] == 0
    done = await handle_job(k, claimed)  # a claimed job runs under its own lease
    assert done.outcome == "completed" and done.ack and w.COUNTS["a"] == 1
    again = await handle_job(k, job_message(claimed))  # a duplicate delivery
    assert (again.dead, again.detail, again.ack) == (True, "gone", True) and w.COUNTS["a"] == 1


async def test_cron_loop_drives_runs_and_reports_the_seed_keys(make_engine: MakeEngine) -> None:
    """The seed's cron loop (one job per tick, then a maintenance tick): the tick wakes the
    nap's due sleep. A fake clock moves only when told, so the sleep falls due between two
    ticks and not while a job is being claimed (a due sleeping job is also claimable
    directly: with a wall clock which of the two saw it first was a race)."""
    sink = MemorySink()
    clock = FakeClock()
    engine = await make_engine(w.linear, w.napper, event_sink=sink, clock=clock)
    k = engine.kernel
    runs = [await engine.start("it-linear", {"n": i}) for i in range(2)]
    nap = await engine.start("it-napper", {"n": 300})
    processed = succeeded = 0
    ticks: list[dict[str, Any]] = []

    async def scheduled(*wanted: str) -> bool:  # the seed's cron handler, plus a poll for jobs
        nonlocal processed, succeeded
        jobs = await process_available_jobs(k)  # max_jobs defaults to 1
        assert jobs.processed <= 1
        processed += jobs.processed
        succeeded += jobs.succeeded
        ticks.append((await run_maintenance_tick(k)).model_dump(by_alias=True))
        infos = [await engine.get_run(r.id) for r in [*runs, nap]]
        return [str(i.status) for i in infos] == list(wanted)

    await eventually(
        lambda: scheduled("completed", "completed", "suspended"), timeout=20, interval=0
    )
    assert sum(t["suspendedChecked"] for t in ticks) == 0  # the nap sleeps: nothing is due
    clock.advance(1.0)
    woke = (await run_maintenance_tick(k)).model_dump(by_alias=True)
    assert woke["suspendedChecked"] == 1
    ticks.append(woke)
    await eventually(lambda: scheduled(*["completed"] * 3), timeout=20, interval=0)
    assert processed == succeeded == 2 * 3 + 2  # the nap's stage ran twice: suspend, resume
    assert all(set(t) == SEED_TICK_KEYS for t in ticks)
    assert sum(t["suspendedChecked"] for t in ticks) == 1
    assert all(t["eventSinkStatus"] == "healthy" and t["claimed"] == 0 for t in ticks)
    assert sum(t["eventsFlushed"] for t in ticks) + len(ticks) > 0
    assert types(sink.for_run(nap.id))[-1] == "run.completed"
    batch = await process_available_jobs(k, max_jobs=5)
    assert batch.model_dump(by_alias=True, exclude={"results"}) == {
        "processed": 0,
        "succeeded": 0,
        "failed": 0,
    }


async def test_tick_reports_a_failing_sink_and_disjoint_dead_letters(
    make_engine: MakeEngine,
) -> None:
    sink = MemorySink()
    sink.failing = True
    engine = await make_engine(
        w.linear,
        event_sink=sink,
        dead_letter_after=2,
        outbox_dead_letter_min_seconds=0,
        outbox_retry_initial_seconds=0,
        outbox_retry_max_seconds=0,
    )
    run = await engine.start("it-linear", {"n": 1})
    first = await run_maintenance_tick(engine.kernel)
    assert first.event_sink_status == "degraded"
    assert first.event_sink_error is not None and "sink" in first.event_sink_error.lower()
    assert (first.events_failed, first.events_dead_lettered, first.events_flushed) == (1, 0, 0)
    second = await run_maintenance_tick(engine.kernel)
    # the second refusal exhausts the budget: dead-lettered, not counted as failed too
    assert (second.events_failed, second.events_dead_lettered) == (0, 1)
    assert second.event_sink_status == "degraded"
    sink.failing = False
    assert await engine.replay_dlq() == 1
    third = await run_maintenance_tick(engine.kernel)
    assert (third.events_flushed, third.event_sink_status, third.event_sink_error) == (
        1,
        "healthy",
        None,
    )
    assert types(sink.for_run(run.id)) == ["run.created"]


async def test_run_to_completion_creates_and_never_waits(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear, w.waiter, w.flaky)
    k = engine.kernel
    command = CreateRun("it-linear", {"n": 1}, idempotency_key="checkout:1")
    res = await run_to_completion(k, command)
    assert (res.outcome, res.status, res.output) == ("completed", "completed", {"result": 5})
    assert (res.jobs_processed, res.foreign_jobs_processed, res.created) == (3, 0, True)
    again = await run_to_completion(k, command)  # idempotent: the same run, no more work
    assert again.workflow_run_id == res.workflow_run_id and not again.created
    assert (again.outcome, again.jobs_processed, again.output) == ("completed", 0, {"result": 5})
    assert set(res.model_dump(by_alias=True)) >= {
        "workflowRunId",
        "status",
        "outcome",
        "output",
        "reason",
        "jobsProcessed",
        "foreignJobsProcessed",
        "suspendedStageId",
    }

    parked = await run_to_completion(k, CreateRun("it-waiter", {"n": 1}))
    assert (parked.outcome, parked.suspended_stage_id, parked.jobs_processed) == (
        "suspended",
        "wait_go",
        2,
    )
    # a retry backoff is not waited for: incomplete, with the reason
    retrying = await run_to_completion(k, CreateRun("it-flaky", {"n": 1}))
    assert retrying.outcome == "incomplete" and "boom" in (retrying.reason or "")
    assert w.COUNTS["boom"] == 1
    assert "due again in" in (retrying.reason or "")  # the 1 s backoff was not awaited
    fatal = await run_to_completion(k, CreateRun("it-flaky", {"n": 2, "note": "fatal"}))
    assert fatal.outcome == "failed" and "boom is fatal" in (fatal.reason or "")
    partial = await run_to_completion(k, CreateRun("it-linear", {"n": 2}), max_jobs=1)
    assert partial.outcome == "incomplete" and "max_jobs" in (partial.reason or "")
    assert partial.jobs_processed == 1


async def test_run_to_completion_helps_while_its_job_is_held(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear)
    k = engine.kernel
    other = await engine.start("it-linear", {"n": 1})
    mine = CreateRun("it-linear", {"n": 2}, idempotency_key="mine")
    run_id, _ = await k.dispatch(mine)
    # another worker holds this run's first job: the call runs foreign jobs for a few rounds
    # (never waits for the lease) and reports incomplete
    held = await k.dispatch(ClaimPending("elsewhere", limit=5))
    assert run_id in {j.run_id for j in held}
    for j in held:
        if j.run_id != run_id:
            await k.dispatch(ReleaseJobs((int(j.id),), "elsewhere"))
    res = await run_to_completion(k, mine, max_claim_rounds=2)
    assert res.outcome == "incomplete" and "max_claim_rounds" in (res.reason or "")
    assert res.foreign_jobs_processed == 2 and res.jobs_processed == 2
    assert (await engine.get_run(other.id)).stage("b").status == "completed"


async def test_tick_applies_retention(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear, retention=0.2)
    res = await run_to_completion(engine.kernel, CreateRun("it-linear", {"n": 1}))
    assert res.outcome == "completed"

    async def purged() -> bool:
        return (await run_maintenance_tick(engine.kernel)).purged == 1

    await eventually(purged, timeout=5, interval=0.05)
    assert await engine.list_runs() == []
    payload = json.dumps((await run_maintenance_tick(engine.kernel)).model_dump(by_alias=True))
    assert '"purged": 0' in payload


async def test_handle_job_acks_a_job_parked_on_a_signal_or_being_moved(
    make_engine: MakeEngine,
) -> None:
    """A re-delivered message for a job that waits for a signal was ``will_retry`` with no
    delay: the consumer re-delivered it at once, again and again, until the signal came. One
    for a job frozen by a migration did the same for as long as the move took (for ever after
    an interrupted one). Both are acked now; the database still finds the job when it is due."""
    engine = await make_engine(w.waiter, w.linear)
    k = engine.kernel
    parked = await run_to_completion(k, CreateRun("it-waiter", {"n": 1}))
    (job,) = await _jobs_of(engine, parked.workflow_run_id)
    again = await handle_job(k, job_message(job).model_dump(by_alias=True))
    assert (again.outcome, again.detail, again.will_retry, again.ack) == (
        "suspended",
        "suspended",
        False,
        True,
    )
    assert again.retry_delay_ms is None and again.stage_id == "wait_go"
    await engine.signal(parked.workflow_run_id, "go", {"ok": True})
    woke = await process_available_jobs(k, 5)  # the acked job is found again once due
    assert woke.processed >= 1
    assert (await engine.get_run(parked.workflow_run_id)).stage("wait_go").status == "completed"

    moving = await engine.start("it-linear", {"n": 1})
    (frozen,) = await _jobs_of(engine, moving.id)
    await engine.export_run(moving.id)
    held = await handle_job(k, job_message(frozen))
    assert (held.detail, held.dead, held.will_retry, held.ack) == ("frozen", True, False, True)
    assert "moved to another driver" in (held.error or "") and w.COUNTS["a"] == 0
    await engine.abort_export(moving.id)
    await process_available_jobs(k, 5)  # an aborted move: the job is found again
    assert w.COUNTS["a"] == 1


async def test_handle_job_with_an_id_no_job_can_have_is_gone(make_engine: MakeEngine) -> None:
    """A job id beyond the id column (PostgreSQL's INTEGER, SQLite's 64-bit rowid) raised the
    driver's OverflowError / NumericValueOutOfRange to the consumer: the platform retried the
    poison message for ever. It names no job: ``gone``, acked."""
    engine = await make_engine(w.linear)
    for message in (
        {"jobId": 2**31},
        {"jobId": 2**63},
        '{"jobId": 99999999999999999999999}',
    ):
        result = await handle_job(engine.kernel, message)
        assert (result.detail, result.dead, result.ack) == ("gone", True, True), message


async def test_entry_points_refuse_arguments_that_are_not_what_they_take(
    make_engine: MakeEngine,
) -> None:
    """Strings raised a bare TypeError from inside, ``max_jobs=1.5`` ran two jobs, a negative
    ``retention`` purged every finished run, a dict for the command a KeyError naming its
    type, a run id that is not a string a TypeError and an idempotency key too long for its
    column a DataError on PostgreSQL: each is an InvalidInputError naming the argument."""
    engine = await make_engine(w.linear)
    k = engine.kernel
    done = await run_to_completion(k, CreateRun("it-linear", {"n": 1}))
    assert done.outcome == "completed"
    linear = CreateRun("it-linear", {"n": 1})
    bad: list[tuple[Callable[[], Awaitable[Any]], str]] = [
        (lambda: process_available_jobs(k, "3"), "max_jobs must be a whole number, not str"),
        (lambda: process_available_jobs(k, 0), "max_jobs must be 1 or more, not 0"),
        (lambda: process_available_jobs(k, None), "max_jobs must be a whole number, not None"),
        (lambda: handle_job(k, {"jobId": 1}, outbox_flush_timeout="9"), "outbox_flush_timeout"),
        (lambda: run_maintenance_tick(k, retention=-1), "retention must be 0 or more, not -1"),
        (lambda: run_maintenance_tick(k, stuck_grace_seconds="x"), "stuck_grace_seconds must"),
        (lambda: run_to_completion(k, linear, max_jobs=1.5), "max_jobs must be a whole number"),
        (lambda: run_to_completion(k, linear, claims_per_round=-1), "claims_per_round must be"),
        (lambda: run_to_completion(k, {"workflow_id": "it-linear"}), "takes a CreateRun command"),
        (lambda: run_to_completion(k, replace(linear, run_id=7)), "run id must be"),
        (lambda: run_to_completion(k, replace(linear, run_id="../x")), "only letters, digits"),
        (lambda: run_to_completion(k, replace(linear, run_id="a/b")), "only letters, digits"),
        (
            lambda: run_to_completion(k, replace(linear, idempotency_key="k" * 301)),
            "idempotency_key is 301 characters",
        ),
    ]
    for call, words in bad:
        with pytest.raises(InvalidInputError, match=words):
            await call()
    assert (await engine.get_run(done.workflow_run_id)).status == "completed"  # not purged
    assert len(await engine.list_runs()) == 1  # nothing was created


async def test_a_chosen_run_id_differing_only_in_case_from_a_run_is_refused(
    make_engine: MakeEngine,
) -> None:
    """A run's blobs live under runs/<run id>/: on a case-insensitive folder store RUN1 and
    run1 share one folder, and purging one deleted the other's blobs. A chosen id that
    differs only in case from an existing run's is refused (RunExistsError naming that run),
    in either direction, without a trace (no run, no blob); the same id is refused as before,
    and an id of its own is taken."""
    engine = await make_engine(w.linear, spill_threshold_bytes=16)
    k = engine.kernel
    big = {"n": 1, "note": "x" * 100}  # (spilled: the refused run must leave no blob)
    first = await run_to_completion(k, CreateRun("it-linear", big, run_id="RUN1"))
    second = await run_to_completion(k, CreateRun("it-linear", big, run_id="run2"))
    assert (first.outcome, second.outcome) == ("completed", "completed")
    blobs = sorted(await k.claim.store.list("runs/"))
    for chosen, existing in (("run1", "RUN1"), ("Run1", "RUN1"), ("RUN2", "run2")):
        with pytest.raises(RunExistsError, match="differs only in case") as err:
            await run_to_completion(k, CreateRun("it-linear", big, run_id=chosen))
        assert (err.value.run_id, err.value.existing) == (chosen, existing)
        assert f"{existing!r}" in str(err.value)
    with pytest.raises(RunExistsError, match="already exists") as same:
        await run_to_completion(k, CreateRun("it-linear", big, run_id="RUN1"))
    assert same.value.existing == "RUN1"
    assert sorted(await k.claim.store.list("runs/")) == blobs
    listed = {r.id for r in await engine.list_runs(workflow_id="it-linear")}
    assert listed == {"RUN1", "run2"}
    third = await run_to_completion(k, CreateRun("it-linear", big, run_id="RUN3"))
    assert third.outcome == "completed"


async def test_an_import_differing_only_in_case_from_a_run_is_refused(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """As a chosen id at creation: a run imported from another database (or driver) whose id
    differs only in case from a run here shares its blob folder on a case-insensitive store.
    It was imported beside it; it is refused (RunExistsError naming the run here), nothing
    written, and the run here is untouched."""
    source = await make_engine(w.linear, database_url=f"sqlite:///{tmp_path / 'source.db'}")
    target = await make_engine(w.linear)
    await source.kernel.dispatch(CreateRun("it-linear", {"n": 1}, run_id="RUN1"))
    here = await run_to_completion(target.kernel, CreateRun("it-linear", {"n": 2}, run_id="run1"))
    assert here.outcome == "completed"
    snapshot = await source.export_run("RUN1")
    with pytest.raises(RunExistsError, match="differs only in case") as err:
        await target.import_run(snapshot)
    assert (err.value.run_id, err.value.existing) == ("RUN1", "run1")
    assert {r.id for r in await target.list_runs(workflow_id="it-linear")} == {"run1"}
    assert (await target.get_run("run1")).status == "completed"
    await source.abort_export("RUN1")  # (the run goes on at its source)
    assert (await source.get_run("RUN1")).status == "pending"


def test_upgrade_from_v18_adds_the_index_of_run_ids_by_case(database_url: str) -> None:
    """v19's index is made on an existing database, whose runs keep their ids (two that
    already differ only in case are left as they are), and the twin check uses it."""
    from driver_native import Database
    from driver_native._runs import case_twin

    db = Database(database_url)
    try:
        db.tx_sync(lambda c: _schema.upgrade(c, target=18))  # (v19 alone makes the index)
        for run_id in ("OLD", "old"):  # twins made before v19: left as they are
            db.tx_sync(
                lambda c, r=run_id: c.execute(
                    _schema.runs.insert().values(
                        id=r,
                        workflow_id="w",
                        version="1",
                        status="completed",
                        input=None,
                        input_fingerprint="",
                        current_group=0,
                        event_seq=0,
                        completed_count=0,
                        redrive_count=0,
                        cancel_requested=False,
                        frozen=False,
                        created_at=0.0,
                        updated_at=0.0,
                    )
                )
            )
        assert db.upgrade() == [v for v, *_ in _schema.MIGRATIONS if v >= 19]

        def indexes(conn: sa.Connection) -> set[str]:
            # (the inspector leaves out SQLite's expression indexes)
            if conn.dialect.name == "sqlite":
                q = "SELECT name FROM sqlite_master WHERE type = 'index'"
            else:
                q = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
            return {str(name) for (name,) in conn.execute(sa.text(q))}

        assert "ix_wfe_runs_id_folded" in db.tx_sync(indexes)
        assert db.tx_sync(lambda c: case_twin(c, "Old")) in ("OLD", "old")
        assert db.tx_sync(lambda c: case_twin(c, "new")) is None
    finally:
        db.dispose()
