"""Scenario S17: a worker process killed with SIGKILL mid-stage; another worker finishes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine_port import MemorySink, RunStatus

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._trace import check_golden, normalise
from .apps.crash import build

__all__ = ["CrashContract"]


async def kill_worker_when(
    harness: Harness,
    app: str,
    wid: str,
    log_path: Path,
    ready: Callable[[], bool],
    what: str,
) -> None:
    """Run a ``wfe worker`` process of ``app`` (a conformance app built for ``wid``, logging
    to ``log_path``) until ``ready()``, then SIGKILL it mid-stage."""
    env = {
        **os.environ,
        **harness.worker_env(),
        "WFE_CONFORMANCE_WF": wid,
        "WFE_CONFORMANCE_LOG": str(log_path),
        "WFE_APP": app,
    }
    err_path = log_path.parent / f"worker-{wid}.err"
    with err_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "wfe_cli",
            "worker",
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        await eventually(lambda: ready() or proc.returncode is not None, timeout=60, what=what)
        assert proc.returncode is None, err_path.read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 10)


class CrashContract:
    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s17_worker_killed_mid_stage(self, harness: Harness, tmp_path: Path) -> None:
        if not harness.capabilities.crash_recovery:
            pytest.skip("driver lacks capability crash_recovery")
        log_path = tmp_path / "log"
        log = ExecutionLog(log_path)
        wid = unique_id("s17")
        registry = build(wid, str(log_path))
        sink = MemorySink()
        async with harness.engine(registry, sink) as engine:
            run = await engine.start(wid, {})
            await kill_worker_when(
                harness,
                "conformance.apps.crash:registry",
                wid,
                log_path,
                lambda: log.count("b-between") == 1,
                "the worker to reach stage b",
            )
            async with engine.worker():
                info = await engine.wait(run.id, timeout=90)
                events = await wait_for_events(sink, run.id, "run.completed", timeout=30)
        assert info.status == RunStatus.COMPLETED
        counts = log.counts()
        assert counts["x"] == 1 and counts["y"] == 1, counts
        assert counts["b"] >= 2 and counts["a"] == 1 and counts["c"] == 1, counts
        trace = normalise(events, registry.get(wid).graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "a", 1],
            ["stage.completed", "a", 1],
            ["stage.started", "b", 1],
            ["stage.completed", "b", 1],
            ["stage.started", "c", 1],
            ["stage.completed", "c", 1],
            ["run.completed"],
        ]
        check_golden("s17_crash", {"trace": trace})
