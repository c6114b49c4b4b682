"""Storage faults are not stage failures (DESIGN §5): a fault of the engine's own database or
blob store while an attempt runs or is recorded abandons the attempt like a crash (no
``stage.failed``, attempt number kept, journaled steps not run again, the lease given back at
once); transient connection errors are retried transparently; a public call raises
DriverUnavailableError only after a bounded retry."""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError

from driver_native import (
    CancelRun,
    ClaimPending,
    ExecuteJob,
    _kernel,
    _progress,
    _schema,
    process_available_jobs,
)
from driver_native._engine import NativeEngine
from driver_native._jobs import Lease
from driver_native._ledger import _consume, journal
from engine_port import (
    EngineSettings,
    NonRetryableError,
    Registry,
    Retry,
    StageContext,
    Workflow,
    create_engine,
)
from engine_port._ledger import StepRecord
from engine_port.errors import DriverUnavailableError
from tests.support.databases import PostgresSession, TcpProxy

from . import workflows as w
from .conftest import MakeEngine

SECRET = "4111-1111-1111-1111"  # a step result that must never reach an error or an event

RAN: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset_ran() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


class In(BaseModel):
    n: int = 0


def _two_steps() -> Workflow[In]:
    wf = Workflow("faults-steps", input=In)

    @wf.stage(retry=Retry(max_attempts=1))
    async def s(ctx: StageContext[In]) -> str:
        RAN["body"] += 1

        def one() -> str:
            RAN["one"] += 1
            return "one"

        def two() -> str:
            RAN["two"] += 1
            return SECRET

        first = await ctx.step.run("one", one)
        second = await ctx.step.run("two", two)
        return f"{first}+{second[:4]}"

    return wf


def _swallowing() -> Workflow[In]:
    """A body that swallows every exception of a step, even a BaseException."""
    wf = Workflow("faults-swallow", input=In)

    @wf.stage(retry=Retry(max_attempts=1))
    async def s(ctx: StageContext[In]) -> str:
        def one() -> str:
            RAN["one"] += 1
            return "one"

        try:
            return str(await ctx.step.run("one", one))
        except BaseException:
            return "swallowed"

    return wf


def _dropped(dialect: str) -> OperationalError:
    """What SQLAlchemy raises when the connection died under a statement; its message goes on
    with the SQL parameters (here the secret)."""
    if dialect == "postgresql":
        orig: Exception = psycopg.OperationalError(
            "terminating connection due to administrator command"
        )
    else:
        orig = sqlite3.OperationalError("database is locked")
    return OperationalError("INSERT INTO wfe_steps ...", {"result": SECRET}, orig)


def _ack_lost_after(db: Any, commits: Callable[[Any], bool]) -> list[bool]:
    """Make the first transaction of ``db`` whose function ``commits(fn)`` picks commit, then
    lose its acknowledgement (the connection drops after COMMIT): the caller sees the drop and
    re-runs it. Returns the list that records (one ``True``) that it happened."""
    real_once = db._tx_once
    lost: list[bool] = []
    dialect = db.engine.dialect.name

    def once(attempt: Any, fn: Any, *args: Any, **kw: Any) -> Any:
        result = real_once(attempt, fn, *args, **kw)
        if not lost and commits(fn):
            lost.append(True)
            raise _dropped(dialect)
        return result

    db._tx_once = once
    return lost


def _inject(
    engine: NativeEngine, fails: Callable[[Any, tuple[Any, ...]], bool], exc: BaseException
) -> list[str]:
    """Make ``engine.kernel.db.tx`` (and ``tx_then_yield``, the same transaction for a caller
    that suspends right after) raise ``exc`` (instead of running the transaction) for each
    call ``fails(fn, args)`` picks; returns the list of names of the calls it failed."""
    db = engine.kernel.db
    failed: list[str] = []

    def failing(real: Any) -> Any:
        async def tx(fn: Any, *args: Any, **kw: Any) -> Any:
            if fails(fn, args):
                failed.append(getattr(fn, "__name__", repr(fn)))
                raise exc
            return await real(fn, *args, **kw)

        return tx

    db.tx = failing(db.tx)  # type: ignore[method-assign]
    db.tx_then_yield = failing(db.tx_then_yield)  # type: ignore[method-assign]
    return failed


def _once(pick: Callable[[Any, tuple[Any, ...]], bool]) -> Callable[[Any, tuple[Any, ...]], bool]:
    done: list[bool] = []

    def fails(fn: Any, args: tuple[Any, ...]) -> bool:
        if not done and pick(fn, args):
            done.append(True)
            return True
        return False

    return fails


def _journals(step: str) -> Callable[[Any, tuple[Any, ...]], bool]:
    def pick(fn: Any, args: tuple[Any, ...]) -> bool:
        return fn is journal and args[0]["name"] == step

    return pick


def _no_leak(info: Any, events: list[Any]) -> None:
    assert info.error is None
    assert all(SECRET not in str(e.data) for e in events)


async def _run_jobs(engine: NativeEngine, worker: str = "w") -> list[str]:
    """Claim and execute due jobs one at a time until none is due; the results in order."""
    results = []
    while True:
        jobs = await engine.kernel.dispatch(ClaimPending(worker, limit=1))
        if not jobs:
            return results
        results.append(await engine.kernel.dispatch(ExecuteJob(jobs[0], worker)))


async def _job_row(engine: NativeEngine, run_id: str) -> Any:
    def q(conn: sa.Connection) -> Any:
        t = _schema.jobs
        return conn.execute(sa.select(t).where(t.c.run_id == run_id)).one()

    return await engine.kernel.db.read(q)


async def _make_due(engine: NativeEngine, run_id: str) -> None:
    """Skip the abandon backoff (instead of sleeping through it)."""

    def q(conn: sa.Connection) -> None:
        t = _schema.jobs
        conn.execute(sa.update(t).where(t.c.run_id == run_id).values(available_at=0))

    await engine.kernel.db.tx(q)


async def test_a_journaling_fault_abandons_the_attempt_without_using_it_up(
    make_engine: MakeEngine,
) -> None:
    """The ledger write of step two fails past the database's retry (DriverUnavailableError):
    the attempt is abandoned, not failed; the job is due again after a backoff with its
    attempt kept; the next try replays step one and runs only step two again."""
    wf = _two_steps()
    engine = await make_engine(wf)
    failed = _inject(
        engine, _once(_journals("two")), DriverUnavailableError("cannot reach the database")
    )
    run = await engine.start(wf.id, {})
    assert await _run_jobs(engine) == ["abandoned"]
    assert failed == ["journal"]
    job = await _job_row(engine, run.id)
    assert (job.status, job.lease_owner, job.attempt) == ("ready", None, 1)
    assert job.available_at > engine.kernel.now()  # after a backoff, not at once
    mid = await engine.get_run(run.id)
    assert mid.status == "running" and mid.stage("s").attempt == 1 and mid.error is None
    await _make_due(engine, run.id)
    assert await _run_jobs(engine) == ["completed"]
    info = await engine.get_run(run.id)
    assert info.status == "completed" and info.output == "one+4111"
    assert info.stage("s").attempt == 1
    assert RAN == {"body": 2, "one": 1, "two": 2}  # step one was journaled: not run again
    events = await engine.events(run.id)
    assert [e.type for e in events if e.stage == "s"] == ["stage.started", "stage.completed"]
    _no_leak(info, events)


async def test_a_dropped_connection_while_journaling_is_retried_transparently(
    make_engine: MakeEngine, database_url: str
) -> None:
    """A transient error (connection terminated, SQLite locked) under the ledger write is
    retried by the database layer: the attempt is not even abandoned."""
    wf = _two_steps()
    engine = await make_engine(wf)
    dialect = engine.kernel.db.engine.dialect.name
    db = engine.kernel.db
    real_once = db._tx_once
    dropped: list[bool] = []

    def once(attempt: Any, fn: Any, *args: Any, **kw: Any) -> Any:
        if not dropped and fn is journal and args[0]["name"] == "two":
            dropped.append(True)
            raise _dropped(dialect)
        return real_once(attempt, fn, *args, **kw)

    db._tx_once = once  # type: ignore[method-assign]
    run = await engine.start(wf.id, {})
    assert await _run_jobs(engine) == ["completed"]
    assert dropped == [True]
    info = await engine.get_run(run.id)
    assert info.status == "completed" and info.stage("s").attempt == 1
    assert RAN == {"body": 1, "one": 1, "two": 1}
    _no_leak(info, await engine.events(run.id))


@pytest.mark.postgres
async def test_backends_terminated_mid_stage_cost_nothing(
    pg_session: PostgresSession, tmp_path: Path
) -> None:
    """A real fault: step two terminates every PostgreSQL backend of the engine (its pooled
    connections die); journaling it and recording the outcome reconnect and go on."""
    app = f"wfe-faults-{uuid.uuid4().hex[:8]}"
    url = pg_session.new_schema() + f"&application_name={app}"
    killer = sa.create_engine(pg_session.url, poolclass=sa.NullPool)
    wf = Workflow("faults-terminate", input=In)

    @wf.stage(retry=Retry(max_attempts=1))
    async def s(ctx: StageContext[In]) -> str:
        def one() -> str:
            RAN["one"] += 1
            return "one"

        def two() -> str:
            RAN["two"] += 1
            with killer.connect() as c:
                n = c.execute(
                    sa.text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = :app"
                    ),
                    {"app": app},
                ).scalar_one()
            RAN["terminated"] += int(n)
            return "two"

        return str(await ctx.step.run("one", one)) + str(await ctx.step.run("two", two))

    engine = create_engine(
        EngineSettings(database_url=url, blob_url=f"file://{tmp_path}"), Registry([wf])
    )
    assert isinstance(engine, NativeEngine)
    try:
        async with engine:
            run = await engine.start(wf.id, {})
            assert await _run_jobs(engine) == ["completed"]
            info = await engine.get_run(run.id)
    finally:
        killer.dispose()
    assert RAN["terminated"] >= 1
    assert info.status == "completed" and info.output == "onetwo"
    assert info.stage("s").attempt == 1
    assert (RAN["one"], RAN["two"]) == (1, 1)


async def test_a_body_that_swallows_the_fault_is_abandoned_all_the_same(
    make_engine: MakeEngine,
) -> None:
    wf = _swallowing()
    engine = await make_engine(wf)
    _inject(engine, _once(_journals("one")), ConnectionResetError("blob store went away"))
    run = await engine.start(wf.id, {})
    assert await _run_jobs(engine) == ["abandoned"]
    await _make_due(engine, run.id)
    assert await _run_jobs(engine) == ["completed"]
    info = await engine.get_run(run.id)
    assert info.output == "one"  # not "swallowed": the faulted attempt's result was dropped
    assert info.stage("s").attempt == 1
    assert RAN["one"] == 2


async def test_a_failed_recording_gives_the_lease_back_at_once(make_engine: MakeEngine) -> None:
    """The outcome's transaction fails past the retry: the job is not left leased to a live
    worker until its lease expires (30 s) but is due again after a short backoff."""
    wf = _two_steps()
    engine = await make_engine(wf, lease_seconds=30)
    _inject(
        engine,
        _once(lambda fn, _a: fn is _kernel._apply_and_read),
        DriverUnavailableError("cannot reach the database"),
    )
    run = await engine.start(wf.id, {})
    assert await _run_jobs(engine) == ["abandoned"]
    job = await _job_row(engine, run.id)
    assert (job.status, job.lease_owner, job.attempt) == ("ready", None, 1)
    assert job.available_at < engine.kernel.now() + 5  # not at lease expiry
    await _make_due(engine, run.id)
    assert await _run_jobs(engine) == ["completed"]
    info = await engine.get_run(run.id)
    assert info.status == "completed" and info.stage("s").attempt == 1
    assert (RAN["one"], RAN["two"]) == (1, 1)  # both steps were journaled before the fault
    events = await engine.events(run.id)
    assert "stage.failed" not in [e.type for e in events]


async def test_a_fault_that_lasts_warns_once_and_says_when_it_is_over(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """An outage of the blob store (or a full disk) lets the job be claimed and abandoned
    again every couple of seconds for as long as it lasts: one WARNING for the outage (the
    rest at DEBUG), one INFO once an attempt goes through, with how many were abandoned."""
    caplog.set_level(logging.INFO, logger="wfe.kernel")
    wf = _two_steps()
    engine = await make_engine(wf, lease_seconds=30)
    failing = [True]
    _inject(
        engine,
        lambda fn, _a: failing[0] and fn is _kernel._apply_and_read,
        DriverUnavailableError("S3 blob store at http://s3:9000: cannot connect"),
    )
    run = await engine.start(wf.id, {})
    for _ in range(3):
        assert await _run_jobs(engine) == ["abandoned"]
        await _make_due(engine, run.id)
    failing[0] = False
    assert await _run_jobs(engine) == ["completed"]
    assert (await engine.get_run(run.id)).status == "completed"
    kernel = [r for r in caplog.records if r.name == "wfe.kernel"]
    warned = [r for r in kernel if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "is abandoned" in warned[0].getMessage(), warned
    back = [r.getMessage() for r in kernel if r.levelno == logging.INFO]
    assert back == ["the engine's storage answers again: 3 attempt(s) were abandoned meanwhile"]


async def test_a_serverless_invocation_gives_back_leases_an_outage_kept(
    make_engine: MakeEngine,
) -> None:
    """An attempt abandoned while the database was away could not give its lease back then;
    the next invocation of a warm serverless host gives it back and runs the job at once, as
    a long-running worker does, instead of leaving it to the lease's expiry (30 s)."""
    wf = _two_steps()
    engine = await make_engine(wf, lease_seconds=30)
    away = DriverUnavailableError("cannot reach the database")
    failed = _inject(
        engine,
        lambda fn, _a: len(failed) < 2 and fn in (_kernel._apply_and_read, _progress.abandon_job),
        away,
    )
    run = await engine.start(wf.id, {})
    first = await process_available_jobs(engine.kernel, worker_id="fn-1")
    assert [r.detail for r in first.results] == ["abandoned"]
    assert failed == ["_apply_and_read", "abandon_job"]
    again = await process_available_jobs(engine.kernel, worker_id="fn-1")
    assert [r.detail for r in again.results] == ["completed"], again
    assert (await engine.get_run(run.id)).status == "completed"


async def test_an_outcome_committed_but_not_acknowledged_keeps_its_output(
    make_engine: MakeEngine,
) -> None:
    """The connection drops after COMMIT, before the acknowledgement: the re-run of the
    transaction finds the lease given up ("discarded"), and the output it committed stays."""
    wf = _two_steps()
    engine = await make_engine(wf, spill_threshold_bytes=1)  # outputs go to the blob store
    db = engine.kernel.db
    # committed, but the caller never hears of it
    lost = _ack_lost_after(db, lambda fn: fn is _kernel._apply_and_read)
    run = await engine.start(wf.id, {})
    assert await _run_jobs(engine) == ["discarded"]
    assert lost == [True]
    info = await engine.get_run(run.id)
    assert info.status == "completed" and info.output == "one+4111"


async def test_a_signal_take_committed_but_not_acknowledged_is_not_taken_twice(
    make_engine: MakeEngine,
) -> None:
    wf = _two_steps()
    engine = await make_engine(wf)
    run = await engine.start(wf.id, {})
    await engine.signal(run.id, "go", {"n": 1})
    await engine.signal(run.id, "go", {"n": 2})
    rec = StepRecord(name="go", kind="signal", completed=False, signal="go")
    [job] = await engine.kernel.dispatch(ClaimPending("w", limit=1))  # (the take's lease)
    db = engine.kernel.db
    # committed: the first signal is taken and journaled
    lost = _ack_lost_after(db, lambda fn: fn is _consume)
    assert await db.tx(_consume, run.id, "s", rec, Lease.of(job, "w")) == {"n": 1}
    assert lost == [True]

    def left(conn: sa.Connection) -> int:
        t = _schema.signals
        q = sa.select(sa.func.count()).where(t.c.run_id == run.id, t.c.consumed.is_(False))
        return int(conn.execute(q).scalar_one())

    assert await db.read(left) == 1  # the second signal is still queued for the next wait


@pytest.mark.postgres
async def test_public_calls_while_postgres_is_unreachable_raise_driver_unavailable(
    pg_session: PostgresSession, tmp_path: Path
) -> None:
    """The server goes away under a connected engine: a public call retries for a bounded
    time, then raises DriverUnavailableError naming the database without its password (no
    raw OperationalError); once the server is back, calls work again."""
    real = sa.make_url(pg_session.new_schema())
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 5432)
    await proxy.start()
    url = real.set(port=proxy.port, password="hunter2").render_as_string(hide_password=False)
    wf = _two_steps()
    engine = create_engine(
        EngineSettings(database_url=url, blob_url=f"file://{tmp_path}"), Registry([wf])
    )
    assert isinstance(engine, NativeEngine)
    async with engine:
        run = await engine.start(wf.id, {})
        engine.kernel.db.retry_seconds = 1.0  # the default (10 s) is for real outages
        proxy.stop()
        for call in (
            engine.get_run(run.id),
            engine.start(wf.id, {}),
            engine.signal(run.id, "go", {}),
        ):
            with pytest.raises(DriverUnavailableError, match=r"retried for .*check that") as e:
                await call
            message = str(e.value)
            assert f"127.0.0.1:{proxy.port}" in message and "hunter2" not in message
            assert "SELECT" not in message and "INSERT" not in message
            assert e.value.__cause__ is None
        await proxy.start()  # the server is back (same port)
        assert (await engine.get_run(run.id)).status == "pending"
    proxy.stop()


async def test_an_unreachable_sqlite_file_is_not_retried(tmp_path: Path) -> None:
    """A configuration error (the file cannot be opened) is reported at once."""
    (tmp_path / "dir").mkdir()
    engine = create_engine(
        EngineSettings(database_url=f"sqlite:///{tmp_path / 'dir'}", blob_url=f"file://{tmp_path}"),
        Registry([_two_steps()]),
    )
    with pytest.raises(DriverUnavailableError, match="unable to open database"):
        await engine.connect()


async def test_a_file_that_is_not_a_database_is_a_typed_error(tmp_path: Path) -> None:
    """A corrupt file, or one that is not SQLite at all, was a raw SQLAlchemy DatabaseError
    from the first statement; the advice is for a file, not for a server."""
    (tmp_path / "wfe.db").write_bytes(b"not a database at all " * 200)
    engine = create_engine(
        EngineSettings(
            database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path}"
        ),
        Registry([_two_steps()]),
    )
    with pytest.raises(DriverUnavailableError, match="file is not a database") as err:
        await engine.connect()
    assert "names a wfe SQLite file" in str(err.value) and "server" not in str(err.value)


@pytest.mark.parametrize("how", ["plain", "idempotency_key"])
async def test_a_start_committed_but_not_acknowledged_returns_its_run(
    make_engine: MakeEngine, how: str
) -> None:
    """The connection drops after the run's COMMIT: the re-run of the transaction must not
    report a duplicate (RunExistsError, a raw IntegrityError) nor create a second run."""
    wf = _two_steps()
    engine = await make_engine(wf)
    db = engine.kernel.db
    lost = _ack_lost_after(db, lambda fn: getattr(fn, "__name__", "") == "_create_run_once")
    key = "k" if how == "idempotency_key" else None
    handle = await engine.start(wf.id, {"n": 1}, idempotency_key=key)
    assert lost == [True]
    assert [r.id for r in await engine.list_runs()] == [handle.id]


async def test_a_command_key_taken_but_not_acknowledged_is_still_ours(
    make_engine: MakeEngine,
) -> None:
    """A command with an idempotency key whose key-taking commit lost its acknowledgement:
    the re-run recognises its own key instead of reporting the command in progress."""
    wf = _two_steps()
    engine = await make_engine(wf)
    run = await engine.start(wf.id, {})
    db = engine.kernel.db
    lost = _ack_lost_after(db, lambda fn: getattr(fn, "__name__", "") == "_key_begin")
    assert await engine.kernel.dispatch(CancelRun(run.id), idempotency_key="cancel-1") is True
    assert lost == [True]
    assert (await engine.get_run(run.id)).status in ("compensating", "cancelled")


async def test_a_compensation_journaling_fault_does_not_record_a_compensation_error(
    make_engine: MakeEngine,
) -> None:
    wf = Workflow("faults-saga", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        return "reserved"

    @a.compensation
    async def release(ctx: StageContext[In], output: str) -> None:
        def undo() -> str:
            RAN["undo"] += 1
            return "released"

        await ctx.step.run("undo", undo)

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        raise NonRetryableError("out of stock")

    engine = await make_engine(wf)

    def pick(fn: Any, args: tuple[Any, ...]) -> bool:
        return fn is journal and args[0]["stage_id"] == "a#compensation"

    failed = _inject(engine, _once(pick), DriverUnavailableError("cannot reach the database"))
    run = await engine.start(wf.id, {})
    results = await _run_jobs(engine)
    assert results[-1] == "abandoned" and failed == ["journal"]
    await _make_due(engine, run.id)
    assert await _run_jobs(engine) == ["compensated"]
    info = await engine.get_run(run.id)
    assert info.status == "failed" and info.error is not None
    assert info.error.type == "NonRetryableError"
    assert info.stage("a").status == "compensated"
    assert info.stage("a").compensation_error is None
    assert RAN["undo"] == 2  # its first result was never journaled


async def test_a_compensation_end_committed_but_not_acknowledged_is_not_a_lost_lease(
    make_engine: MakeEngine,
) -> None:
    """The connection drops after the COMMIT that ended the compensated run: its re-run finds
    the job gone because that commit deleted it, not because the lease was taken over."""
    engine = await make_engine(w.flaky)
    db = engine.kernel.db
    # committed, but the caller never hears of it
    lost = _ack_lost_after(db, lambda fn: fn is _progress.finish_compensation)
    run = await engine.start("it-flaky", {"n": 1, "note": "fatal"})
    assert await _run_jobs(engine) == ["completed", "failed", "compensated"]
    assert lost == [True]
    info = await engine.get_run(run.id)
    assert info.status == "failed" and info.stage("first").status == "compensated"
    assert w.COUNTS["undo_first"] == 1


def _saga_undo(fails: bool) -> Workflow[In]:
    """Stage a completes, stage b fails for good; a's compensation succeeds, or (``fails``)
    fails for good."""
    wf = Workflow(f"faults-saga-record-{'fails' if fails else 'ok'}", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        return "reserved"

    @a.compensation
    async def release(ctx: StageContext[In], output: str) -> None:
        RAN["undo"] += 1
        if fails:
            raise NonRetryableError("cannot release")

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        raise NonRetryableError("out of stock")

    return wf


@pytest.mark.parametrize("undo", ["compensated", "fails"])
async def test_a_compensation_record_committed_but_not_acknowledged_is_not_recorded_twice(
    make_engine: MakeEngine, undo: str
) -> None:
    """The connection drops after the COMMIT that recorded stage a's compensation: the re-run
    of that transaction (the compensation job still held) finds it recorded and writes
    nothing, and reports it recorded (the compensation goes on, not "discarded"): one
    stage.compensated event, the one committed (the same id and place), or one compensation
    error, not two."""
    wf = _saga_undo(fails=undo == "fails")
    engine = await make_engine(wf)
    db = engine.kernel.db
    # committed, but the caller never hears of it
    lost = _ack_lost_after(db, lambda fn: fn is _progress.record_compensation)
    run = await engine.start(wf.id, {})
    assert await _run_jobs(engine) == ["completed", "failed", "compensated"]
    assert lost == [True]
    assert RAN["undo"] == 1
    info = await engine.get_run(run.id)
    assert info.status == "failed"
    events = await engine.events(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len({e.id for e in events}) == len(events)
    of_a = [e.type for e in events if e.stage == "a"]
    if undo == "fails":
        assert info.stage("a").status == "completed"
        assert info.stage("a").compensation_error is not None
        assert [e.message for e in info.compensation_errors] == ["cannot release"]
        assert "stage.compensated" not in of_a
    else:
        assert info.stage("a").status == "compensated"
        assert info.compensation_errors == []
        assert of_a == ["stage.started", "stage.completed", "stage.compensated"]
    assert events[-1].type == "run.failed"
