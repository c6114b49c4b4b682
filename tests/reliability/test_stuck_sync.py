"""A sync stage that never returns cannot wedge a worker (issue 11, item 5): sync bodies run in
a bounded pool of their own, past their timeout they are abandoned (counted, logged), and
neither other sync stages, blob I/O, nor the process's exit wait for them."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conformance._models import Num
from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine

ROOT = Path(__file__).resolve().parents[2]

STUCK = 6  # more than the stdlib default executor holds on a 2-core machine


async def _eventually(check: Callable[[], Awaitable[Any] | Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last {value!r})")
        await asyncio.sleep(0.05)


async def test_stuck_sync_stages_do_not_block_other_sync_stages_or_blob_io(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()
    entered: list[str] = []
    stuck = Workflow(f"stuck-{uuid.uuid4().hex[:6]}", input=Num)

    retry = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50))

    @stuck.stage(timeout=timedelta(seconds=1), retry=retry)
    def hang(ctx: StageContext[Num]) -> int:
        entered.append(ctx.run_id)
        release.wait()  # "never" returns: only the test's cleanup lets it go
        return 0

    normal = Workflow(f"normal-{uuid.uuid4().hex[:6]}", input=Num)

    @normal.stage
    def big(ctx: StageContext[Num]) -> str:
        return "x" * 300_000  # over the spill threshold: written through the blob store

    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
        blob_url=f"file://{tmp_path / 'blobs'}",
    )
    engine = create_engine(settings, Registry([stuck, normal]))
    caplog.set_level(logging.WARNING, logger="wfe.runner")
    try:
        async with engine, engine.worker() as worker:
            ids = [(await engine.start(stuck.id, {})).id for _ in range(STUCK)]
            await _eventually(lambda: len(entered) >= STUCK, 60, "every stuck body running")
            run = await engine.start(normal.id, {})
            done = await engine.wait(run.id, timeout=60)
            assert done.status == "completed"
            assert done.output == "x" * 300_000
            assert any(p.is_file() for p in (tmp_path / "blobs").rglob("*"))  # it did spill
            for rid in ids:
                info = await engine.wait(rid, timeout=60)
                assert info.status == "failed"
                assert info.error is not None and info.error.type == "StageTimeoutError"
                assert info.stages[0].attempt == 2  # retried per its Retry policy
            stats = worker.stats()
            assert stats["sync_abandoned_total"] == 2 * STUCK
            assert stats["sync_abandoned_running"] == 2 * STUCK
    finally:
        release.set()
    warnings = [r for r in caplog.records if "abandoned" in r.getMessage()]
    assert len(warnings) == 2 * STUCK
    assert ids[0] in "".join(r.getMessage() for r in warnings)


async def test_a_wedged_sync_pool_still_runs_async_stages_and_times_sync_ones_out(
    tmp_path: Path,
) -> None:
    """Past its bound (threads + as many abandoned) the pool stops growing: a sync stage then
    waits for a thread under its own timeout, and async stages and blob I/O go on."""
    release = threading.Event()
    entered: list[str] = []
    wf = Workflow(f"wedge-{uuid.uuid4().hex[:6]}", input=Num)

    @wf.stage(timeout=timedelta(seconds=1), retry=Retry(max_attempts=1))
    def hang(ctx: StageContext[Num]) -> int:
        entered.append(ctx.run_id)
        release.wait()
        return 0

    later = Workflow(f"later-{uuid.uuid4().hex[:6]}", input=Num)

    @later.stage(timeout=timedelta(seconds=1), retry=Retry(max_attempts=1))
    def sync_one(ctx: StageContext[Num]) -> int:
        return 1

    @later.stage
    async def async_one(ctx: StageContext[Num]) -> str:
        return "y" * 300_000

    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
        blob_url=f"file://{tmp_path / 'blobs'}",
        sync_stage_threads=1,
    )
    engine = create_engine(settings, Registry([wf, later]))
    try:
        async with engine, engine.worker() as worker:
            ids = [(await engine.start(wf.id, {})).id for _ in range(2)]
            for rid in ids:
                assert (await engine.wait(rid, timeout=60)).status == "failed"
            assert len(entered) == 2  # one thread, plus one replacement for the abandoned one
            assert worker.stats()["sync_threads"] == 2
            info = await engine.wait((await engine.start(later.id, {})).id, timeout=60)
            by_id = {s.id: s for s in info.stages}
            assert by_id["async_one"].status == "completed"
            assert by_id["sync_one"].status == "failed"
            assert by_id["sync_one"].error is not None
            assert by_id["sync_one"].error.type == "StageTimeoutError"
            assert worker.stats()["sync_threads"] == 2  # bounded: no third thread
    finally:
        release.set()


async def _default_timeout_applies(settings: EngineSettings) -> None:
    release = threading.Event()
    wf = Workflow(f"deft-{uuid.uuid4().hex[:6]}", input=Num)

    @wf.stage(retry=Retry(max_attempts=1))
    def hang(ctx: StageContext[Num]) -> int:
        release.wait()
        return 0

    engine = create_engine(settings, Registry([wf]))
    try:
        async with engine, engine.worker():
            info = await engine.wait((await engine.start(wf.id, {})).id, timeout=60)
            assert info.status == "failed"
            assert info.error is not None and info.error.type == "StageTimeoutError"
            assert "default_stage_timeout" in info.error.message
    finally:
        release.set()


async def test_a_default_stage_timeout_applies_to_stages_without_their_own(tmp_path: Path) -> None:
    await _default_timeout_applies(
        EngineSettings(
            database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
            blob_url=f"file://{tmp_path / 'blobs'}",
            default_stage_timeout=1.0,
        )
    )


@pytest.mark.temporal
async def test_temporal_applies_the_default_stage_timeout_too(
    temporal_server: Any, tmp_path: Path
) -> None:
    await _default_timeout_applies(
        EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"dst-{uuid.uuid4().hex[:8]}",
            blob_url=f"file://{tmp_path / 'blobs'}",
            default_stage_timeout=1.0,
        )
    )


def test_a_worker_with_a_stuck_sync_stage_exits_on_sigterm(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STUCK_DIR": str(tmp_path),
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "WFE_APP": "tests.reliability.stuck_app:registry",
    }
    cmd = [sys.executable, "-m", "wfe_cli", "worker"]
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:

        async def start_and_wait_entered() -> None:
            from tests.reliability import stuck_app

            settings = EngineSettings(
                database_url=env["WFE_DATABASE_URL"], blob_url=env["WFE_BLOB_URL"]
            )
            async with create_engine(settings, stuck_app.registry) as engine:
                run = await engine.start("stuck-sync", {})
                await _eventually((tmp_path / "entered-1").is_file, 60, "the stuck body running")
                # past its 1 s timeout the body is abandoned and the run fails
                info = await engine.wait(run.id, timeout=60)
                assert info.status == "failed"

        asyncio.run(start_and_wait_entered())
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)  # a hang guard, not a timing assertion
        except subprocess.TimeoutExpired:
            raise AssertionError(
                "the worker did not exit with a stuck sync body:\n"
                + (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
            ) from None
        assert code == 0, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
