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


def _versioned(version: str) -> Workflow[In]:
    wf = Workflow("eager-versions", input=In, version=version)

    @wf.stage
    async def which(ctx: StageContext[In]) -> str:
        return version

    return wf


async def test_a_run_of_one_of_several_served_versions_runs_on_its_own(
    make_engine: Any,
) -> None:
    """Temporal hands an eager start's first task to any worker of the queue in the process,
    whatever Worker Deployment version it polls as: an engine serving v1 and v2 starts runs of
    either without it, so every workflow task of a v1 run is taken by the v1 worker."""
    old = make_engine(Registry([_versioned("v1")]))
    both = make_engine(Registry([_versioned("v1"), _versioned("v2")]))
    async with old, both, both.worker():
        runs = [await old.start("eager-versions", {}) for _ in range(6)]
        for run in runs:
            assert (await both.wait(run.id, timeout=60)).output == "v1"
        for run in runs:
            again = await both.redrive(run.id, from_="start")  # pinned to v1, started by both
            assert again.version == "v1"
            assert (await both.wait(again.id, timeout=60)).output == "v1"
            history = await both._conn.get_workflow_handle(again.id).fetch_history()
            takers = {
                ev.workflow_task_completed_event_attributes.deployment_version.build_id
                for ev in history.events
                if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            }
            assert takers == {"v1"}, takers
