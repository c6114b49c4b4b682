"""Several hosts on one PostgreSQL database, played by worker processes (multihost_app.py):
hosts whose wall clocks are off the database's, a worker paused past its lease and resumed,
hosts that deploy different versions of a workflow. The database's clock decides when a lease
expires and when a timer or a retry is due, whatever the clock of the host that set it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from driver_native import NativeEngine, _schema
from engine_port import create_engine
from tests.support.databases import PostgresSession

from . import multihost_app as app
from ._procs import WorkerProcs, counts, eventually

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]


class Hosts(WorkerProcs):
    """Worker subprocesses running multihost_app, each waited for until ready."""

    def __init__(self, url: str, work: Path) -> None:
        super().__init__(url, work, "tests.reliability.multihost_app", "MH_DIR")

    def spawn(self, url: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        proc = self.start(url, **env)
        self.wait_ready(proc)
        return proc


@pytest.fixture
def pg_url(pg_session: PostgresSession) -> str:
    return pg_session.new_schema()


@pytest.fixture
def hosts(pg_url: str, tmp_path: Path) -> Iterator[Hosts]:
    h = Hosts(pg_url, tmp_path)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
async def client(pg_url: str, tmp_path: Path) -> Any:
    """An engine of the test's own (this host's clock is right), serving nothing."""
    engine = create_engine(app.settings(pg_url, tmp_path), app.registry)
    assert isinstance(engine, NativeEngine)
    async with engine:
        yield engine


async def _suspended(engine: NativeEngine, run_id: str) -> bool:
    return (await engine.get_run(run_id)).stage("sleeper").status == "suspended"


async def _terminal(engine: NativeEngine, run_id: str) -> Any:
    info = await engine.get_run(run_id)
    return info if info.terminal else None


async def test_a_timer_set_on_a_host_whose_clock_runs_ahead_fires_on_time_elsewhere(
    client: NativeEngine, hosts: Hosts
) -> None:
    """A durable sleep of 3 s begun on a host 10 minutes ahead is due 3 s later by the
    database's clock: another host wakes it then, not 10 minutes later."""
    fast = hosts.spawn(MH_SKEW="600")
    run = await client.start("mh-nap", {"nap": 3})
    await eventually(lambda: _suspended(client, run.id), 60, "the stage asleep", hosts)
    hosts.kill(fast)  # (asleep: no lease held)
    hosts.spawn()
    info = await eventually(lambda: _terminal(client, run.id), 90, "the run woken", hosts)
    assert info.status == "completed"
    # not silent: the host with the wrong clock says so, and what to do
    assert "clock is 600.0s ahead of the database's" in hosts.logs()
    assert "NTP" in hosts.logs()


async def test_a_host_whose_clock_runs_ahead_does_not_fire_a_timer_early(
    client: NativeEngine, hosts: Hosts
) -> None:
    """A durable sleep of 15 s begun on a host with a right clock is not woken early by a
    host 10 minutes ahead, neither by its poll nor by the stage's own check of the deadline."""
    right = hosts.spawn()
    run = await client.start("mh-nap", {"nap": 15})
    await eventually(lambda: _suspended(client, run.id), 60, "the stage asleep", hosts)
    asleep = time.monotonic()
    hosts.kill(right)
    hosts.spawn(MH_SKEW="600")
    info = await eventually(lambda: _terminal(client, run.id), 120, "the run woken", hosts)
    assert info.status == "completed"
    # (woken at 15 s after it fell asleep, which was before the test saw it asleep)
    assert time.monotonic() - asleep >= 13, "the timer fired early"


async def test_a_host_whose_clock_runs_behind_runs_work_that_is_due(
    client: NativeEngine, hosts: Hosts
) -> None:
    """Stages made due now by a host with a right clock are claimed at once by a host 10
    minutes behind (not 10 minutes later), and its leases do not look expired to others."""
    hosts.spawn(MH_SKEW="-600")
    runs = [await client.start("mh-ver", {}, version="1") for _ in range(5)]
    for run in runs:
        info = await eventually(lambda r=run: _terminal(client, r.id), 60, "the run", hosts)
        assert info.status == "completed"


FENCE_TRACE = [
    ("run.created", None),
    ("run.started", None),
    ("stage.started", "b"),
    ("stage.completed", "b"),
    ("stage.started", "c"),
    ("stage.completed", "c"),
    ("run.completed", None),
]


async def _marker(hosts: Hosts, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, hosts.logs()
    return (hosts.work / f"marker-{proc.pid}").exists()


async def test_a_worker_paused_past_its_lease_and_resumed_changes_nothing(
    client: NativeEngine, hosts: Hosts
) -> None:
    """A worker SIGSTOPped mid-stage (step x journaled) past its lease: another takes the
    stage over, replays x and completes the run. Resumed, the paused worker writes nothing
    over the new owner's work (no event, no outcome), and no journaled step runs again."""
    paused = hosts.spawn(MH_LEASE_SECONDS="2")
    run = await client.start("mh-fence", {})
    await eventually(lambda: _marker(hosts, paused), 60, "step x journaled", hosts)
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        taker = hosts.spawn(MH_LEASE_SECONDS="2")
        await eventually(lambda: _marker(hosts, taker), 90, "the stage taken over", hosts)
        (hosts.work / "go").write_text("go")
        (hosts.work / "go2").write_text("go")
        info = await eventually(lambda: _terminal(client, run.id), 60, "the run", hosts)
        assert info.status == "completed"
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    # the resumed worker finds its lease gone; stopped, it has done all it was going to
    (hosts.work / "stop").write_text("stop")
    paused.wait(timeout=60)
    info = await client.get_run(run.id)
    assert (info.status, info.output, info.stage("b").attempt) == ("completed", "xyc", 1)
    events = await client.events(run.id)
    assert [(e.type, e.stage) for e in events] == FENCE_TRACE
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    runs = Counter((pid, what) for pid, r, what in counts(hosts.work) if r == run.id)
    assert runs == {
        (str(paused.pid), "x"): 1,  # journaled, then paused: not run again by the taker
        (str(taker.pid), "y"): 1,  # journaled by the taker: never run by the resumed worker
        (str(taker.pid), "c"): 1,
    }, hosts.logs()


async def _cmarker(hosts: Hosts, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, hosts.logs()
    return (hosts.work / f"cmarker-{proc.pid}").exists()


async def test_a_worker_paused_past_its_lease_in_a_compensation_runs_no_step_of_the_new_owner(
    client: NativeEngine, hosts: Hosts
) -> None:
    """As for a stage attempt, with a compensation: SIGSTOPped after its step ux was
    journaled, past its lease; another worker takes the compensation over, replays ux and
    runs uy. Resumed, the paused worker must not run uy's body (the new owner journaled it):
    it ran it once more before its lease was checked only at uy's journal write."""
    paused = hosts.spawn(MH_LEASE_SECONDS="2")
    run = await client.start("mh-comp", {})
    await eventually(lambda: _cmarker(hosts, paused), 60, "step ux journaled", hosts)
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        taker = hosts.spawn(MH_LEASE_SECONDS="2")
        await eventually(lambda: _cmarker(hosts, taker), 90, "the compensation taken", hosts)
        (hosts.work / "cgo").write_text("go")
        (hosts.work / "cgo2").write_text("go")
        info = await eventually(lambda: _terminal(client, run.id), 60, "the run", hosts)
        assert info.status == "failed"
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    # the resumed worker finds its lease gone; stopped, it has done all it was going to
    (hosts.work / "stop").write_text("stop")
    paused.wait(timeout=60)
    info = await client.get_run(run.id)
    assert (info.status, info.stage("a").status) == ("failed", "compensated"), info
    runs = Counter((pid, what) for pid, r, what in counts(hosts.work) if r == run.id)
    assert runs == {
        (str(paused.pid), "ux"): 1,  # journaled, then paused: not run again by the taker
        (str(taker.pid), "uy"): 1,  # journaled by the taker: never run by the resumed worker
    }, hosts.logs()


async def test_hosts_serving_different_versions_run_only_their_own(
    client: NativeEngine, hosts: Hosts
) -> None:
    """Two hosts deploy different versions of ``mh-ver`` on one database: a run pinned to a
    version runs only on the host that serves it."""
    one = hosts.spawn(MH_VERSIONS="1")
    two = hosts.spawn(MH_VERSIONS="2")
    runs = {v: [await client.start("mh-ver", {}, version=v) for _ in range(6)] for v in "12"}
    for v, started in runs.items():
        for run in started:
            info = await eventually(lambda r=run: _terminal(client, r.id), 60, "a run", hosts)
            assert (info.status, info.output) == ("completed", f"v{v}")
    who = {r: pid for pid, r, _what in counts(hosts.work)}
    assert {who[r.id] for r in runs["1"]} == {str(one.pid)}
    assert {who[r.id] for r in runs["2"]} == {str(two.pid)}
    served = {(v.workflow_id, v.version) for v in await client.list_versions()}
    assert {("mh-ver", "1"), ("mh-ver", "2")} <= served


def _terminate_blocked(admin: sa.Connection, app: str, holder: sa.Connection) -> int:
    """Terminate the backends of ``app`` waiting for a lock ``holder`` holds: in the middle of
    a transaction. (What they were running is not told reliably: pg_stat_activity's query is
    the last one sent as text, not a statement sent later by the extended protocol.)"""
    held_by = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    return int(
        admin.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = :app AND :holder = ANY(pg_blocking_pids(pid))"
            ),
            {"app": app, "holder": held_by},
        ).scalar_one()
    )


def _backends(admin: sa.Connection, app: str) -> list[tuple[Any, ...]]:
    """What the backends of ``app`` are doing (state, what they wait for, their last query
    sent as text): why a worker did not wait for a lock, when it did not."""
    rows = admin.execute(
        sa.text(
            "SELECT state, wait_event_type, wait_event, left(query, 80) FROM pg_stat_activity "
            "WHERE application_name = :app"
        ),
        {"app": app},
    )
    return [tuple(r) for r in rows]


async def _journaled(engine: NativeEngine, run_id: str, step: str) -> bool:
    def q(conn: sa.Connection) -> bool:
        t = _schema.steps
        stmt = sa.select(t.c.name).where(t.c.run_id == run_id, t.c.name == step, t.c.completed)
        return conn.execute(stmt).first() is not None

    return await engine.kernel.db.read(q)


@pytest.mark.parametrize("held", ["journal", "outcome"])
async def test_a_connection_killed_while_a_stage_records_is_no_stage_failure(
    client: NativeEngine, hosts: Hosts, pg_url: str, held: str
) -> None:
    """The worker's backend is terminated in the middle of a transaction, held up by a row
    lock the test takes: the journal of step y (its lease check waits for the job row), or
    the stage's outcome (it locks the run row). The worker goes on with a new connection:
    the run completes with the trace of a clean run, attempt 1, no step run twice, and the
    worker still up."""
    app = f"wfe-mh-{uuid.uuid4().hex[:8]}"
    # (the stage's gates hold the worker's event loop, heartbeats too, from step x until the
    # test has taken its lock: beside a CPU hog that took longer than the default 30 s lease,
    # which then expired, and the outcome was never written to wait for the lock. This test
    # is about a killed connection, not a lease: one no wait here outlasts)
    worker = hosts.spawn(url=pg_url + f"&application_name={app}", MH_LEASE_SECONDS="600")
    run = await client.start("mh-fence", {})
    await eventually(lambda: _marker(hosts, worker), 60, "step x", hosts)
    await eventually(lambda: _journaled(client, run.id, "x"), 60, "step x journaled", hosts)
    if held == "outcome":
        (hosts.work / "go").write_text("go")
        await eventually(lambda: _journaled(client, run.id, "y"), 60, "step y journaled", hosts)
    table = _schema.jobs if held == "journal" else _schema.runs
    key = table.c.run_id if held == "journal" else table.c.id
    admin_engine = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)
    try:
        # (admin autocommits: pg_stat_activity is read once per transaction, so a backend the
        # worker opened after the first look stayed out of every later one, and a worker that
        # waited for the lock on it was never found: "the worker never waited", beside load)
        with (
            admin_engine.connect() as holder,
            admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as admin,
        ):
            holder.execute(sa.select(table.c.id).where(key == run.id).with_for_update())
            (hosts.work / ("go" if held == "journal" else "go2")).write_text("go")
            deadline = time.monotonic() + 60
            while not _terminate_blocked(admin, app, holder):
                assert worker.poll() is None, hosts.logs()
                assert time.monotonic() < deadline, (
                    f"the worker never waited: {_backends(admin, app)}, step y ran: "
                    f"{(hosts.work / f'after-y-{worker.pid}').exists()}\n{hosts.logs()}"
                )
                await asyncio.sleep(0.05)
            holder.rollback()
    finally:
        admin_engine.dispose()
        (hosts.work / "go").write_text("go")
        (hosts.work / "go2").write_text("go")
    info = await eventually(lambda: _terminal(client, run.id), 60, "the run", hosts)
    assert worker.poll() is None, hosts.logs()
    assert (info.status, info.output, info.stage("b").attempt, info.error) == (
        "completed",
        "xyc",
        1,
        None,
    ), hosts.logs()
    events = await client.events(run.id)
    assert [(e.type, e.stage) for e in events] == FENCE_TRACE
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    runs = Counter(what for _pid, r, what in counts(hosts.work) if r == run.id)
    assert runs == {"x": 1, "y": 1, "c": 1}, hosts.logs()
