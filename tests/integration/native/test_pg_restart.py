"""The PostgreSQL server restarting under a stream of runs (DESIGN §5, "Infrastructure faults
are not stage failures"): a fast restart, a crash (``pg_ctl stop -m immediate``) and an outage
longer than the retry budget, on a private cluster this module starts (never the shared server).

What must hold: no run lost or stuck once the server is back; no stage attempt charged (no
``stage.failed``, attempt numbers kept); journaled steps not run again; the worker's LISTEN
connection comes back by itself; while the server is down a caller gets
``DriverUnavailableError`` (no raw psycopg or SQLAlchemy error) and the worker logs bounded
warnings, no traceback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_native import NativeEngine
from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine
from engine_port.errors import DriverUnavailableError, EngineError

from .conftest import eventually

pytestmark = pytest.mark.postgres

_BIN = Path(shutil.which("pg_ctl") or "/usr/local/bin/pg_ctl").parent
_RUNUSER = shutil.which("runuser")
_NEEDS = "initdb and pg_ctl (a PostgreSQL server installation) on PATH or in /usr/local/bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """A PostgreSQL cluster of this module's own, in a temporary folder, on a free port (run
    as ``nobody`` when the tests run as root: initdb refuses root)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="wfe-pgr-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            if _RUNUSER is None:
                pytest.skip("running as root and runuser is missing (initdb refuses root)")
            self.prefix = [_RUNUSER, "-u", "nobody", "--"]
            shutil.chown(self.dir, "nobody")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self.prefix, str(_BIN / tool), *args]
        done = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=60, cwd=self.dir
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.dir / "log")
        self._run("pg_ctl", "start", "-D", str(self.data), "-o", opts, "-l", log, "-w")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PrivateServer]:
    if not ((_BIN / "initdb").exists() and (_BIN / "pg_ctl").exists()):
        pytest.skip(f"needs {_NEEDS}")
    server = PrivateServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


# -- the workflow: durable steps, a timer, a signal wait ----------------------------------------
class In(BaseModel):
    n: int = 0
    hold: bool = False


STEPS: Counter[str] = Counter()
GATE: dict[str, asyncio.Event] = {}


def _gate(name: str) -> asyncio.Event:
    return GATE.setdefault(name, asyncio.Event())


def _workflow() -> Workflow[In]:
    wf = Workflow("pg-restart", input=In)
    retry = Retry(max_attempts=2, initial_interval=timedelta(seconds=0.1))

    @wf.stage(retry=retry)
    async def one(ctx: StageContext[In]) -> int:
        n = ctx.input.n

        def s1() -> int:
            STEPS[f"{n}:s1"] += 1
            return n

        def s2() -> int:
            STEPS[f"{n}:s2"] += 1
            return 2 * n

        a = await ctx.step.run("s1", s1)
        if ctx.input.hold:
            _gate("held").set()
            await _gate("release").wait()
        await ctx.step.sleep("nap", timedelta(milliseconds=150))
        b = await ctx.step.run("s2", s2)
        return int(a) + int(b)

    @wf.stage(after=[one], retry=retry)
    async def two(ctx: StageContext[In]) -> dict[str, Any]:
        n = ctx.input.n
        got = await ctx.step.wait_for_signal("go")

        def s3() -> int:
            STEPS[f"{n}:s3"] += 1
            return 3

        c = await ctx.step.run("s3", s3)
        return {"r": int(ctx.output_of(one)) + int(c), "got": got}

    return wf


class Sink:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def publish(self, events: list[Any]) -> None:
        self.events.extend(events)


@pytest.fixture
async def engines(
    pg_server: PrivateServer, tmp_path: Path
) -> AsyncIterator[tuple[NativeEngine, NativeEngine, Sink]]:
    """(client, worker's engine, the worker's event sink): two engines on one fresh schema,
    as a client process and a worker process would have."""
    STEPS.clear()
    GATE.clear()
    import psycopg

    with psycopg.connect(pg_server.url.replace("+psycopg", ""), autocommit=True) as c:
        c.execute("DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public")
    made: list[NativeEngine] = []
    sink = Sink()
    for event_sink in (None, sink):
        settings = EngineSettings(
            database_url=pg_server.url,
            blob_url=f"file://{tmp_path / 'blobs'}",
            database_retry_seconds=2.0,
        )
        eng = create_engine(settings, Registry([_workflow()]), event_sink=event_sink)
        assert isinstance(eng, NativeEngine)
        await eng.connect()
        made.append(eng)
    try:
        yield made[0], made[1], sink
    finally:
        for eng in reversed(made):
            await eng.close()


async def _pump(client: NativeEngine, ids: dict[int, str], stop: asyncio.Event) -> Counter[str]:
    """A client: starts a run every 50 ms until ``stop``; what it raised, by type."""
    raised: Counter[str] = Counter()
    while not stop.is_set():
        n = len(ids) + 1
        try:
            ids[n] = (await client.start("pg-restart", {"n": n}, idempotency_key=f"r{n}")).id
        except EngineError as exc:
            raised[type(exc).__name__] += 1
            assert "check that the server runs" in str(exc), exc
        except Exception as exc:  # pragma: no cover (the failure this test guards)
            raised[f"raw {type(exc).__module__}.{type(exc).__name__}"] += 1
        await asyncio.sleep(0.05)
    return raised


async def _finish(
    client: NativeEngine, ids: dict[int, str], sink: Sink, unsure: frozenset[int] = frozenset()
) -> None:
    """Signal every run, wait for all of them, and check nothing was charged or re-run (but
    step ``s1`` of the runs ``unsure``, whose journal write may have met the outage)."""
    for n, run_id in ids.items():
        await client.signal(run_id, "go", {"n": n}, idempotency_key=f"go{n}")
    for run_id in ids.values():
        info = await client.wait(run_id, timeout=30)
        assert info.status == "completed", info
        assert [(s.id, s.status, s.attempt) for s in info.stages] == [
            ("one", "completed", 1),
            ("two", "completed", 1),
        ], info
    for n in ids:
        assert STEPS[f"{n}:s1"] == 1 or (n in unsure and STEPS[f"{n}:s1"] == 2), (n, STEPS)
        assert STEPS[f"{n}:s3"] == 1, (n, STEPS)
    assert not [e for e in sink.events if e.type in ("stage.failed", "run.failed")]


def _wfe_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("wfe")]


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_restart_mid_stream(
    pg_server: PrivateServer,
    engines: tuple[NativeEngine, NativeEngine, Sink],
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fast restart, and a crash (immediate stop, then start): the stream goes on, the held
    stage (a step journaled before, one after) completes with its attempt, nothing fails."""
    caplog.set_level(logging.WARNING, logger="wfe")
    client, host, sink = engines
    async with host.worker(poll_interval=0.5) as worker:
        await eventually(lambda: _true(worker.listening.is_set()), timeout=10)
        held = await client.start("pg-restart", {"n": 0, "hold": True})
        ids: dict[int, str] = {0: held.id}
        await asyncio.wait_for(_gate("held").wait(), 10)
        stop = asyncio.Event()
        pump = asyncio.create_task(_pump(client, ids, stop))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(pg_server.stop, mode)
        await asyncio.to_thread(pg_server.start)
        back = time.monotonic()
        _gate("release").set()
        await asyncio.sleep(0.5)
        stop.set()
        raised = await pump
        assert not [k for k in raised if k.startswith("raw")], raised
        # the LISTEN connection is back by itself, soon
        await eventually(lambda: _true(worker.listening.is_set()), timeout=5)
        await _finish(client, ids, sink)
        assert time.monotonic() - back < 30
        assert len(ids) > 5
        assert worker.stats().get("engine_errors", 0) == 0, worker.stats()
    assert not [r for r in _wfe_records(caplog) if r.levelno >= logging.ERROR or r.exc_info]


async def _true(value: bool) -> bool:
    return value


async def test_outage_longer_than_retry_budget(
    pg_server: PrivateServer,
    engines: tuple[NativeEngine, NativeEngine, Sink],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server down for longer than ``database_retry_seconds`` (2 s here): calls raise
    DriverUnavailableError saying what to check; the held stage's step write fails, so its
    attempt is abandoned (not failed: no retry used, s1 not run again); the worker logs
    warnings without tracebacks, and once the server is back everything completes."""
    caplog.set_level(logging.WARNING, logger="wfe")
    client, host, sink = engines
    async with host.worker(poll_interval=0.5) as worker:
        await eventually(lambda: _true(worker.listening.is_set()), timeout=10)
        held = await client.start("pg-restart", {"n": 0, "hold": True})
        ids: dict[int, str] = {0: held.id}
        await asyncio.wait_for(_gate("held").wait(), 10)
        for n in range(1, 4):
            ids[n] = (await client.start("pg-restart", {"n": n}, idempotency_key=f"r{n}")).id
        await asyncio.to_thread(pg_server.stop, "fast")
        down = time.monotonic()
        _gate("release").set()  # (its next step's journal write meets the outage)
        with pytest.raises(DriverUnavailableError, match="check that the server runs"):
            await client.start("pg-restart", {"n": 99})
        with pytest.raises(DriverUnavailableError, match="check that the server runs"):
            await client.signal(held.id, "go", {})
        with pytest.raises(DriverUnavailableError, match="check that the server runs"):
            await client.get_run(held.id)
        # (the worker's own retries run out meanwhile)
        await asyncio.sleep(max(0.0, 6 - (time.monotonic() - down)))
        await asyncio.to_thread(pg_server.start)
        back = time.monotonic()
        await eventually(lambda: _true(worker.listening.is_set()), timeout=5)
        # (run 0's s1 was journaled before the outage: never run again)
        await _finish(client, ids, sink, unsure=frozenset(range(1, 4)))
        # the abandoned attempts' leases were given back once the server answered: they did
        # not wait for their leases to expire (30 s)
        assert time.monotonic() - back < 15, time.monotonic() - back
        assert worker.stats().get("leases_returned", 0) >= 1, worker.stats()
        assert STEPS["0:s2"] <= 2  # (not journaled before the outage: it may run again)
        assert worker.stats().get("engine_errors", 0) == 0, worker.stats()
    records = _wfe_records(caplog)
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], [
        (r.name, r.getMessage()[:200]) for r in records if r.levelno >= logging.ERROR or r.exc_info
    ]
    assert len(records) < 40, [(r.name, r.getMessage()[:120]) for r in records]
    # one warning per outage for the LISTEN connection and one for the worker's loop, not
    # one per reconnection attempt or per loop iteration
    for what in ("LISTEN connection for due jobs failed", "the database is unreachable"):
        assert len([r for r in records if what in r.getMessage()]) == 1, (what, records)
