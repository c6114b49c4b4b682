"""A run started by an engine whose worker serves its version in the same process gets its
first workflow task handed back with the start (Temporal's eager workflow start): no dispatch
through the server's matching service, which took 20-200 ms for a run started right after the
previous one ended (bench/README.md, 2026-12-02)."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

from engine_port import Registry, StageContext, Workflow

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


def _registry() -> Registry:
    wf = Workflow("eager-one", input=In)

    @wf.stage
    async def only(ctx: StageContext[In]) -> int:
        return 1

    return Registry([wf])


def _first_task_wait_ms(history: Any) -> float:
    """Milliseconds between the first workflow task's scheduling and its start."""
    times = {}
    for ev in history.events:
        if ev.event_type in (
            EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        ):
            times.setdefault(ev.event_type, ev.event_time.ToNanoseconds())
    started = times[EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED]
    return (started - times[EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED]) / 1e6


async def test_a_run_started_beside_its_worker_starts_eagerly(make_engine: Any) -> None:
    engine = make_engine(_registry())
    waits = []
    async with engine.worker():
        for _ in range(3):
            run = await engine.start("eager-one", {})
            assert (await engine.wait(run.id, timeout=60)).status == "completed"
            history = await engine._conn.get_workflow_handle(run.id).fetch_history()
            waits.append(_first_task_wait_ms(history))
    # eager: both events in the start's own transaction (microseconds apart); dispatched by
    # matching to a polling worker: milliseconds at the very least
    assert statistics.median(waits) < 1.0, waits
