"""The S3 blob store going away and coming back under a stream of runs on the native driver
(PostgreSQL, two workers sharing the database and the bucket; DESIGN §5, "Infrastructure faults
are not stage failures" and "Claim check").

Every value here is over ``spill_threshold_bytes``: run inputs, stage outputs, step results and
signal payloads all live in S3. What must hold:

- an outage that keeps the data (a TCP proxy in front of moto, stopped ~8 s: connection
  refused) is a storage fault: no ``stage.failed``, attempts kept, journaled steps not run
  again, ``start``/``signal`` with a big value raise ``DriverUnavailableError`` saying what to
  check, promptly, and every run completes once S3 answers, with no operator action;
- an S3 server restarted without its data (moto keeps it in memory) must not leave runs stuck
  or retrying forever: new runs work again at once (the bucket is created anew).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

pytest.importorskip("minio", reason="needs the minio client (pip install 'wfe[s3]')")
pytest.importorskip("moto.server", reason="needs moto[server] (pip install 'wfe[dev]')")

from driver_native import NativeEngine
from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine
from engine_port.errors import DriverUnavailableError
from tests.integration.s3_server import MotoS3Server, free_port
from tests.support.databases import PostgresSession, TcpProxy

pytestmark = pytest.mark.postgres

THRESHOLD = 1024
BIG = 4 * THRESHOLD  # characters: every value below is spilled to S3


class In(BaseModel):
    n: int = 0
    pad: str = ""
    hold: bool = False


STEPS: Counter[str] = Counter()
GATE: dict[str, asyncio.Event] = {}


def _gate(name: str) -> asyncio.Event:
    return GATE.setdefault(name, asyncio.Event())


def _workflow() -> Workflow[In]:
    wf = Workflow("s3-outage", input=In)
    retry = Retry(max_attempts=2, initial_interval=timedelta(seconds=0.1))

    @wf.stage(retry=retry)
    async def one(ctx: StageContext[In]) -> str:
        n = ctx.input.n

        def s1() -> str:
            STEPS[f"{n}:s1"] += 1
            return "1" * BIG

        def s2() -> str:
            STEPS[f"{n}:s2"] += 1
            return "2" * BIG

        a = await ctx.step.run("s1", s1)
        if ctx.input.hold:
            _gate("held").set()
            await _gate("release").wait()
        b = await ctx.step.run("s2", s2)
        return f"{n}:{str(a)[:10]}{str(b)[:10]}{ctx.input.pad}"

    @wf.stage(after=[one], retry=retry, signals=["go"])
    async def two(ctx: StageContext[In]) -> dict[str, Any]:
        n = ctx.input.n
        got = await ctx.step.wait_for_signal("go")

        def s3() -> str:
            STEPS[f"{n}:s3"] += 1
            return "3" * BIG

        c = await ctx.step.run("s3", s3)
        return {"one": str(ctx.output_of(one))[:20], "got": len(got["pad"]), "s3": c}

    return wf


class RestartableMoto(MotoS3Server):
    """moto's server, restartable on the same port (losing its data: moto keeps it in memory),
    stopped with SIGTERM or SIGKILL."""

    def __init__(self) -> None:
        super().__init__(start_timeout=30.0, stop_timeout=10.0)
        self.fixed_port = free_port()

    def start(self) -> str:
        proc_port = self.fixed_port
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        self.port = proc_port
        proc = self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(proc_port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.start_timeout
        while not self._answers_http():
            if proc.poll() is not None or time.monotonic() > deadline:
                output = self._output()
                self.stop()
                raise RuntimeError(f"moto did not serve on {self.endpoint}:\n{output}")
            time.sleep(0.05)
        return self.endpoint

    def signal_stop(self, sig: int) -> None:
        proc, self._proc = self._proc, None
        assert proc is not None
        proc.send_signal(sig)
        proc.wait(timeout=self.stop_timeout)
        if self._log is not None:
            self._log.close()
            self._log = None


@pytest.fixture
def moto() -> Iterator[RestartableMoto]:
    server = RestartableMoto()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def proxy(moto: RestartableMoto) -> AsyncIterator[TcpProxy]:
    p = TcpProxy("127.0.0.1", moto.port)
    await p.start()
    try:
        yield p
    finally:
        if p.server is not None and p.server.is_serving():
            p.stop()


async def _engines(database_url: str, endpoint: str) -> list[NativeEngine]:
    """A client and two worker hosts on one database and one fresh bucket."""
    bucket = f"wfe-{uuid.uuid4().hex[:12]}"
    blob_url = f"s3://{bucket}/t?endpoint={endpoint}&access_key=test&secret_key=test&timeout=5"
    made: list[NativeEngine] = []
    for _ in range(3):
        settings = EngineSettings(
            database_url=database_url,
            blob_url=blob_url,
            spill_threshold_bytes=THRESHOLD,
        )
        eng = create_engine(settings, Registry([_workflow()]))
        assert isinstance(eng, NativeEngine)
        await eng.connect()
        made.append(eng)
    return made


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    STEPS.clear()
    GATE.clear()
    yield
    STEPS.clear()
    GATE.clear()


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("wfe")]


def _no_raw(what: BaseException | logging.LogRecord) -> None:
    text = what.getMessage() if isinstance(what, logging.LogRecord) else str(what)
    for raw in ("botocore", "urllib3", "minio", "Traceback", "MaxRetryError"):
        assert raw not in text, text


async def _check_unavailable(coro: Any, limit: float = 15.0) -> float:
    began = time.monotonic()
    with pytest.raises(DriverUnavailableError) as info:
        await asyncio.wait_for(coro, limit)
    took = time.monotonic() - began
    assert "S3 blob store" in str(info.value) and "check that" in str(info.value), info.value
    _no_raw(info.value)
    return took


async def _until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_an_outage_that_keeps_the_data_costs_nothing(
    pg_session: PostgresSession,
    proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    client, h1, h2 = await _engines(pg_session.new_schema(), f"127.0.0.1:{proxy.port}")
    try:
        async with h1.worker(poll_interval=0.5) as w1, h2.worker(poll_interval=0.5) as w2:
            pad = "p" * BIG
            held = await client.start("s3-outage", {"n": 0, "hold": True, "pad": pad})
            ids = {0: held.id}
            await asyncio.wait_for(_gate("held").wait(), 20)
            for n in range(1, 5):
                ids[n] = (await client.start("s3-outage", {"n": n, "pad": pad})).id
            # wait until some stage two waits for its signal (its s1, s2, output spilled)
            await _until(lambda: _any_suspended(client, [ids[n] for n in range(1, 5)]), timeout=20)
            proxy.stop()
            down = time.monotonic()
            _gate("release").set()  # its s2 result's spill meets the outage
            took = await _check_unavailable(client.start("s3-outage", {"n": 99, "pad": pad}))
            assert took < 15, took
            took = await _check_unavailable(client.signal(ids[1], "go", {"pad": pad}))
            assert took < 15, took
            # keep S3 down ~8 s (several abandoned tries of the held attempt)
            await asyncio.sleep(max(0.0, 8 - (time.monotonic() - down)))
            await proxy.start()
            back = time.monotonic()
            for n, run_id in ids.items():
                await client.signal(run_id, "go", {"pad": pad}, idempotency_key=f"go{n}")
            for run_id in ids.values():
                info = await client.wait(run_id, timeout=40)
                assert info.status == "completed", info
                assert [(s.id, s.status, s.attempt) for s in info.stages] == [
                    ("one", "completed", 1),
                    ("two", "completed", 1),
                ], info
                events = await client.events(run_id)
                assert not [e for e in events if e.type in ("stage.failed", "run.failed")]
            assert time.monotonic() - back < 30
            for n in ids:
                assert STEPS[f"{n}:s1"] == 1, (n, STEPS)
                assert STEPS[f"{n}:s3"] == 1, (n, STEPS)
            assert STEPS["0:s2"] <= 2, STEPS
            for w in (w1, w2):
                assert w.stats().get("engine_errors", 0) == 0, w.stats()
    finally:
        for eng in (h2, h1, client):
            await eng.close()
    # no raw urllib3 "Retrying ..." warning per request; the engine's own warnings are short
    foreign = [
        r for r in caplog.records if r.levelno >= logging.WARNING and r not in _records(caplog)
    ]
    assert not foreign, [(r.name, r.getMessage()[:200]) for r in foreign]
    records = _records(caplog)
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info]
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) < 40, [r.getMessage()[:120] for r in warnings]
    for r in warnings:
        _no_raw(r)


async def _any_suspended(client: NativeEngine, ids: list[str]) -> bool:
    for run_id in ids:
        info = await client.get_run(run_id)
        if info.stage("two").status == "suspended":
            return True
    return False


async def _restarted(
    pg_session: PostgresSession, moto: RestartableMoto
) -> tuple[list[NativeEngine], dict[int, str]]:
    """A client and two hosts on a fresh schema, and three runs with all their data in S3."""
    engines = await _engines(pg_session.new_schema(), moto.endpoint)
    client = engines[0]
    pad = "p" * BIG
    ids = {n: (await client.start("s3-outage", {"n": n, "pad": pad})).id for n in range(3)}
    return engines, ids


async def _stop_and_restart(client: NativeEngine, moto: RestartableMoto, sig: int) -> None:
    """moto stopped with ``sig`` (a big ``start`` meanwhile is a typed error, promptly), then
    started again on its port, empty."""
    await asyncio.to_thread(moto.signal_stop, sig)
    took = await _check_unavailable(client.start("s3-outage", {"n": 99, "pad": "p" * BIG}))
    assert took < 15, took
    await asyncio.to_thread(moto.start)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
async def test_a_restart_without_the_data_lets_new_runs_work(
    pg_session: PostgresSession,
    moto: RestartableMoto,
    sig: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bucket is gone after the restart: the store creates it again on the next write
    (it used to remember it had made sure of it, so every write failed with NoSuchBucket
    until the process restarted: no run could start or spill anything)."""
    caplog.set_level(logging.WARNING)
    engines, ids = await _restarted(pg_session, moto)
    client, h1, h2 = engines
    try:
        async with h1.worker(poll_interval=0.5) as w1, h2.worker(poll_interval=0.5) as w2:
            await _until(lambda: _all_suspended(client, list(ids.values())), timeout=20)
            await _stop_and_restart(client, moto, sig)
            pad = "p" * BIG
            fresh = await client.start("s3-outage", {"n": 10, "pad": pad})
            await client.signal(fresh.id, "go", {"pad": pad})
            info = await client.wait(fresh.id, timeout=30)
            assert info.status == "completed", info
            assert [(s.id, s.attempt) for s in info.stages] == [("one", 1), ("two", 1)]
            for w in (w1, w2):
                assert w.stats().get("engine_errors", 0) == 0, w.stats()
    finally:
        for eng in (h2, h1, client):
            await eng.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [
        (r.name, r.getMessage()[:200]) for r in caplog.records
    ]


async def _all_suspended(client: NativeEngine, ids: list[str]) -> bool:
    for run_id in ids:
        info = await client.get_run(run_id)
        if info.stage("two").status != "suspended":
            return False
    return True
