"""The hand-written temporalio workflows: the same activities, written the Temporal way.

Only workflow and activity definitions live here (the workflow sandbox re-imports this
module for every run); measuring code is in ``_temporal.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

__all__ = ["PINNED", "TASK_QUEUE", "worker"]

TASK_QUEUE = "bench-raw"
PINNED = ("bench-raw", "v1")
"""(deployment name, build id) of ``worker(pinned=True)``: Worker Deployment versioning with
workflows pinned, as the driver's workers serve each definition version"""
STAMPS: list[float] = []
_T = timedelta(seconds=30)


@activity.defn(name="bench_noop")
async def noop(i: int) -> int:
    return i


@activity.defn(name="bench_echo")
async def echo(value: Any) -> Any:
    return value


@activity.defn(name="bench_tick")
async def tick(i: int) -> int:
    STAMPS.append(time.perf_counter())
    return i


@workflow.defn(name="bench_seq3")
class Seq3:
    @workflow.run
    async def run(self, local: bool) -> int:
        total = 0
        for i in range(3):
            if local:
                total += await workflow.execute_local_activity(noop, i, start_to_close_timeout=_T)
            else:
                total += await workflow.execute_activity(noop, i, start_to_close_timeout=_T)
        return total


@workflow.defn(name="bench_fanout")
class Fanout:
    @workflow.run
    async def run(self, width: int) -> int:
        await workflow.execute_activity(noop, 0, start_to_close_timeout=_T)
        parts = await asyncio.gather(
            *(workflow.execute_activity(noop, i, start_to_close_timeout=_T) for i in range(width))
        )
        await workflow.execute_activity(noop, 1, start_to_close_timeout=_T)
        return sum(parts)


@workflow.defn(name="bench_long")
class Long:
    """1,000 durable steps as local activities (1,000 regular activities would be 1,000
    server round trips; local activities are Temporal's cheap durable step)."""

    @workflow.run
    async def run(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += await workflow.execute_local_activity(tick, i, start_to_close_timeout=_T)
        return total


@workflow.defn(name="bench_signal")
class Signal:
    def __init__(self) -> None:
        self.value: Any = None

    @workflow.signal(name="go")
    def go(self, value: Any) -> None:
        self.value = value

    @workflow.query(name="waiting")
    def waiting(self) -> bool:
        return True

    @workflow.run
    async def run(self) -> Any:
        await workflow.wait_condition(lambda: self.value is not None)
        # the driver's signal stage returns the payload: hand the value to an activity
        return await workflow.execute_activity(echo, self.value, start_to_close_timeout=_T)


@contextlib.asynccontextmanager
async def worker(address: str, *, pinned: bool = False) -> AsyncIterator[Any]:
    from temporalio.client import Client
    from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
    from temporalio.worker import Worker, WorkerDeploymentConfig

    client = await Client.connect(address)
    versioning: dict[str, Any] = {}
    if pinned:
        versioning["deployment_config"] = WorkerDeploymentConfig(
            version=WorkerDeploymentVersion(*PINNED),
            use_worker_versioning=True,
            default_versioning_behavior=VersioningBehavior.PINNED,
        )
    async with Worker(
        client,
        **versioning,
        task_queue=TASK_QUEUE,
        workflows=[Seq3, Fanout, Long, Signal],
        activities=[noop, echo, tick],
    ):
        yield client
