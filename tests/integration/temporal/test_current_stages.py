"""``get_run`` tells a run's current stages though its memo lags (runs started since the
afternoon of 2026-12-02 write their ``wfe_run`` memo only when their status, a stage they wait
or failed in, or a freeze changes: ``driver_temporal._current``). Read through the Temporal API:
the memo still shows the stages of the last status change, while ``get_run`` answers from the
run (a worker answers the query), from its replayed history (no worker; an operator terminated
it), and a redrive of a terminated run never runs a stage that had completed again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import Registry, RunInfo, StageContext, Workflow

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


def _lagging(gate: asyncio.Event, runs: dict[str, int]) -> Workflow[In]:
    wf = Workflow("lags", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        runs["a"] += 1
        return 1

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        runs["b"] += 1
        await gate.wait()
        return 2

    @wf.stage(after=[b])
    async def c(ctx: StageContext[In]) -> int:
        return 3

    return wf


async def _until_b_runs(engine: Any, run_id: str) -> RunInfo:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = await engine.get_run(run_id)
        if [s.status for s in info.stages] == ["completed", "running", "pending"]:
            return info
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never ran b after a: {info.stages}")


async def _memo_stages(engine: Any, run_id: str) -> list[str]:
    """The stage statuses the run's ``wfe_run`` memo holds (what visibility shows)."""
    memo = await engine._memo_of(await engine._describe_raw(run_id))
    return [s["status"] for s in memo["wfe_run"]["stages"]]


@pytest.fixture
def lagging(make_engine: EngineFactory) -> tuple[Any, asyncio.Event, dict[str, int]]:
    """(an engine serving ``lags``, the gate that lets its stage b end, how often a and b ran)"""
    gate, runs = asyncio.Event(), {"a": 0, "b": 0}
    return make_engine(Registry([_lagging(gate, runs)])), gate, runs


async def test_get_run_asks_a_running_run_for_the_stages_its_memo_lags(lagging: Any) -> None:
    engine, gate, runs = lagging
    async with engine, engine.worker():
        run = await engine.start("lags", {})
        info = await _until_b_runs(engine, run.id)
        assert info.status == "running" and info.stages[0].output == 1
        # the memo was written when the run began running (a running), not since
        assert await _memo_stages(engine, run.id) == ["running", "pending", "pending"]
        gate.set()
        done = await engine.wait(run.id, timeout=30)
    assert done.status == "completed" and [s.output for s in done.stages] == [1, 2, 3]
    assert runs == {"a": 1, "b": 1}


async def test_with_no_worker_get_run_reads_the_stages_from_the_history(
    make_engine: EngineFactory,
) -> None:
    gate, runs = asyncio.Event(), {"a": 0, "b": 0}
    registry = Registry([_lagging(gate, runs)])
    engine = make_engine(registry)
    async with engine:
        run = await engine.start("lags", {})
        async with engine.worker():
            await _until_b_runs(engine, run.id)
        reader = make_engine(registry)  # another process's engine: no worker anywhere
        async with reader:
            began = time.monotonic()
            info = await reader.get_run(run.id)
            took = time.monotonic() - began
        assert await _memo_stages(engine, run.id) == ["running", "pending", "pending"]
    assert info.status == "running"
    assert [(s.status, s.output) for s in info.stages] == [
        ("completed", 1),
        ("running", None),
        ("pending", None),
    ]
    # the query to a task queue whose worker just stopped waits its whole timeout: the
    # history is replayed once it has taken half a second (it took 5.3 s before)
    assert took < reader.signal_timeout


async def test_a_terminated_run_keeps_its_completed_stages_and_redrive_skips_them(
    lagging: Any,
) -> None:
    engine, gate, runs = lagging
    async with engine, engine.worker():
        run = await engine.start("lags", {})
        await _until_b_runs(engine, run.id)
        await engine._conn.get_workflow_handle(run.id).terminate(reason="ops ticket 9")
        info = await engine.get_run(run.id)
        assert info.status == "failed" and info.error is not None
        assert "ops ticket 9" in info.error.message
        # a had completed (its memo said running), b was cut short
        assert [(s.status, s.output) for s in info.stages] == [
            ("completed", 1),
            ("cancelled", None),
            ("pending", None),
        ]
        gate.set()
        await engine.redrive(run.id)
        done = await engine.wait(run.id, timeout=30)
    assert done.status == "completed" and [s.output for s in done.stages] == [1, 2, 3]
    assert runs == {"a": 1, "b": 2}
