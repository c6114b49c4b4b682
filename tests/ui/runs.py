"""Runs of the demo workflow in three states, made by a real worker, for the web view tests."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from engine_port import EngineSettings, RunStatus, create_engine
from wfe_cli._demo import build_demo


@dataclass(frozen=True)
class DemoRuns:
    completed: str
    failed: str
    waiting: str  # suspended in stage approve, waiting for signal "approval"


async def wait_status(engine: object, run_id: str, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (await engine.get_run(run_id)).status != status:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not reach {status} in {timeout}s")
        await asyncio.sleep(0.05)


async def make_demo_runs(settings: EngineSettings) -> DemoRuns:
    """:func:`drive_demo` with an engine and worker of its own."""
    async with create_engine(settings, build_demo()) as engine, engine.worker():
        return await drive_demo(engine)


async def drive_demo(engine: Any) -> DemoRuns:
    """Start three demo orders on a connected engine whose worker runs: one completes, one
    fails in ship (and is compensated), one stays suspended waiting for its approval signal."""
    ok = await engine.start("demo-order", {"order_id": "A-1", "total": 100.0})
    bad = await engine.start("demo-order", {"order_id": "B-2", "total": 5.0, "fail_shipping": True})
    waiting = await engine.start(
        "demo-order", {"order_id": "C-3", "total": 42.0}, idempotency_key="order-C-3"
    )
    for run in (ok, bad, waiting):
        await wait_status(engine, run.id, RunStatus.SUSPENDED)
    for run in (ok, bad):
        await engine.signal(run.id, "approval", {"approved_by": "test"})
    for run in (ok, bad):
        await engine.wait(run.id, timeout=30)
    return DemoRuns(ok.id, bad.id, waiting.id)
