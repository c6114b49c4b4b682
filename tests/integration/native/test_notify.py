"""PostgreSQL LISTEN/NOTIFY: a transaction that makes a job due wakes the idle workers of
other processes at once; their poll stays as the safety net. Two engines on one schema stand
for two processes: one only starts runs and sends signals, the other only works, with a poll
interval far longer than the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_port import EngineSettings, Registry, RunStatus, create_engine
from tests.support.databases import PostgresSession

from . import workflows
from .conftest import MakeEngine, eventually

POLL = 120.0  # the worker's poll interval: no poll comes due while the test runs


@pytest.fixture
def postgres_url(database_url: str) -> str:
    if database_url.startswith("sqlite"):
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; on SQLite workers poll")
    return database_url


async def _parked(engine: Any) -> Any:
    """An ``it-waiter`` run started through ``engine``, once its stage waits for "go"."""
    run = await engine.start("it-waiter", {})

    async def suspended() -> bool:
        info = await engine.get_run(run.id)
        return any(s.id == "wait_go" and s.status == "suspended" for s in info.stages)

    await eventually(suspended, timeout=POLL / 4)
    return run


async def test_a_worker_of_another_engine_is_woken_by_notify_not_by_its_poll(
    postgres_url: str, make_engine: MakeEngine
) -> None:
    starter = await make_engine()  # no worker: its runs go to the queue
    working = await make_engine()
    async with working.worker(poll_interval=POLL) as host:

        async def listening() -> bool:
            return host.listening.is_set()

        await eventually(listening, timeout=30)
        for n in range(2):
            run = await starter.start("it-linear", {"n": n})
            info = await starter.wait(run.id, timeout=POLL / 4)
            assert info.status == RunStatus.COMPLETED
            assert info.stages[-1].output == {"result": (n + 1) * 2 + 1}

        # a signal sent from the other engine makes the waiting stage due: notified too
        run = await _parked(starter)
        before = host.stats()["woken_by_notify"]
        await starter.signal(run.id, "go", {"ok": True})
        info = await starter.wait(run.id, timeout=POLL / 4)
        assert info.status == RunStatus.COMPLETED
        stats = host.stats()
    assert stats["woken_by_notify"] > before >= 2  # a start each, then the signal
    assert stats.get("woken_by_poll", 0) == 0  # every wake-up came from a notification


async def test_notifications_of_another_schema_are_ignored(
    postgres_url: str, make_engine: MakeEngine, pg_session: PostgresSession, tmp_path: Path
) -> None:
    """Workers of another schema in the same database hear the channel too: they ignore a
    payload that is not their schema (and keep polling)."""
    starter = await make_engine()
    working = await make_engine()
    settings = EngineSettings(
        database_url=pg_session.new_schema(), blob_url=f"file://{tmp_path / 'other-blobs'}"
    )
    async with (
        create_engine(settings, Registry(workflows.ALL)) as elsewhere,
        working.worker(poll_interval=POLL) as host,
    ):

        async def listening() -> bool:
            return host.listening.is_set()

        await eventually(listening, timeout=30)
        foreign = await elsewhere.start("it-linear", {"n": 1})
        ours = await starter.start("it-linear", {"n": 2})  # committed after the foreign one
        assert (await starter.wait(ours.id, timeout=POLL / 4)).status == RunStatus.COMPLETED
        # notifications arrive in commit order: the foreign one came first, and was ignored
        assert host.stats()["woken_by_notify"] == 1
        assert (await elsewhere.get_run(foreign.id)).status == RunStatus.PENDING


async def test_its_own_engines_notifications_do_not_wake_a_worker_twice(
    postgres_url: str, make_engine: MakeEngine
) -> None:
    """A signal sent through the worker's own engine wakes it directly; the NOTIFY the same
    transaction sends comes back from one of that engine's connections and is ignored (no
    second, empty claim)."""
    engine = await make_engine()
    async with engine.worker(poll_interval=POLL) as host:

        async def listening() -> bool:
            return host.listening.is_set()

        await eventually(listening, timeout=30)
        run = await _parked(engine)
        await engine.signal(run.id, "go", {"ok": True})
        assert (await engine.wait(run.id, timeout=POLL / 4)).status == RunStatus.COMPLETED
        # a foreign start, committed after the signal: once it is heard, the signal's NOTIFY
        # (delivered before it) has been seen too
        other = await make_engine()
        foreign = await other.start("it-linear", {"n": 1})
        assert (await other.wait(foreign.id, timeout=POLL / 4)).status == RunStatus.COMPLETED
        assert host.stats()["woken_by_notify"] == 1  # the foreign start only


async def test_a_signal_whose_stage_this_process_leases_wakes_no_other_process(
    postgres_url: str, make_engine: MakeEngine
) -> None:
    """The stage a signal wakes is leased, in the signal's own transaction, to the sending
    engine's worker when it serves the run: no other process can take that job, so their
    workers are not woken for it (each would make an empty claim per signal)."""
    engine = await make_engine()
    elsewhere = await make_engine()  # another process's worker, idle
    async with elsewhere.worker(poll_interval=POLL) as other:
        async with engine.worker(poll_interval=POLL) as own:

            async def listening() -> bool:
                return own.listening.is_set() and other.listening.is_set()

            await eventually(listening, timeout=30)
            run = await _parked(engine)
            before = other.stats().get("woken_by_notify", 0)
            await engine.signal(run.id, "go", {"ok": True})
            assert (await engine.wait(run.id, timeout=POLL / 4)).status == RunStatus.COMPLETED
        # a start committed after the signal, which only the other worker can run (its poll
        # never comes due): once it completed, the other worker heard its NOTIFY, and every
        # notification sent before it (they arrive in commit order)
        starter = await make_engine()
        fence = await starter.start("it-linear", {"n": 1})
        assert (await starter.wait(fence.id, timeout=POLL / 4)).status == RunStatus.COMPLETED
        assert other.stats()["woken_by_notify"] == before + 1  # the fence's, not the signal's


async def test_a_notification_during_a_pass_is_not_lost(
    postgres_url: str, make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NOTIFY that arrives while the worker's loop is busy (here: held in its maintenance,
    after its claim found nothing) makes the loop look again at once; it was cleared with the
    pass, and the run waited for the next poll (``POLL``: longer than the test)."""
    import asyncio
    import contextlib

    from driver_native._worker import WorkerHost

    busy, go = asyncio.Event(), asyncio.Event()
    maintenance = WorkerHost._maintenance
    held = {"once": False}

    async def slow_maintenance(self: WorkerHost) -> None:
        if host_ready.is_set() and not held["once"]:
            held["once"] = True
            busy.set()
            await go.wait()
        await maintenance(self)

    monkeypatch.setattr(WorkerHost, "_maintenance", slow_maintenance)
    host_ready = asyncio.Event()
    starter = await make_engine()
    working = await make_engine()
    async with working.worker(poll_interval=POLL, maintenance_interval=0.01) as host:

        async def listening() -> bool:
            return host.listening.is_set()

        await eventually(listening, timeout=30)
        host_ready.set()
        for _ in range(600):  # passes until one is held in its maintenance (its claim done)
            host.wake()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(busy.wait(), 0.05)
                break
        try:
            assert busy.is_set()
            before = host.stats()["woken_by_notify"]
            run = await starter.start("it-linear", {"n": 1})  # NOTIFY now

            async def notified() -> bool:
                return bool(host.stats()["woken_by_notify"] > before)

            await eventually(notified, timeout=30)
        finally:
            go.set()  # (the worker's stop waits for its loop)
        info = await starter.wait(run.id, timeout=POLL / 4)
        assert info.status == RunStatus.COMPLETED
        assert host.stats().get("woken_by_poll", 0) == 0


async def test_a_repinned_run_wakes_a_worker_of_its_new_version_in_another_process(
    postgres_url: str, make_engine: MakeEngine
) -> None:
    """``redrive(run, version=...)`` of a pending run moves its due job to the new version's
    queue and notifies, as a start does: the idle worker of that version in another
    process claims it at once, not at its next poll (120 s away)."""
    from pydantic import BaseModel

    from engine_port import StageContext, Workflow

    class Nothing(BaseModel):
        pass

    def build(version: str) -> Workflow[Any]:
        wf = Workflow("it-repin", input=Nothing, version=version)

        @wf.stage
        async def a(ctx: StageContext[Any]) -> str:
            return version

        return wf

    old = await make_engine(build("v1"))  # starts the run; no v1 worker anywhere
    operator = await make_engine(build("v2"))  # re-pins it; no worker either
    working = await make_engine(build("v2"))
    run = await old.start("it-repin", {})
    async with working.worker(poll_interval=POLL) as host:

        async def listening() -> bool:
            return host.listening.is_set()

        await eventually(listening, timeout=30)
        before = host.stats().get("woken_by_notify", 0)
        assert (await operator.redrive(run.id, version="latest")).version == "v2"
        info = await operator.wait(run.id, timeout=POLL / 4)
        stats = host.stats()
    assert (info.status, info.output) == (RunStatus.COMPLETED, "v2")
    assert stats["woken_by_notify"] > before
    assert stats.get("woken_by_poll", 0) == 0
