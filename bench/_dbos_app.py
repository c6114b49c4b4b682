"""The benchmark workflows written the DBOS way (DBOS Transact, PyPI ``dbos``): a workflow
of ``@DBOS.step`` calls; fan-out with ``asyncio.gather`` over steps; signals with
``DBOS.send`` / ``DBOS.recv``; throughput through a DBOS queue served by worker processes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dbos import DBOS, DBOSConfig

__all__ = ["QUEUE", "STAMPS", "launch", "register_queue", "register_queue_async", "shutdown"]

QUEUE = "bench"
STAMPS: list[float] = []


@DBOS.step(name="bench_noop")
async def noop(i: int) -> int:
    return i


@DBOS.step(name="bench_tick")
async def tick(i: int) -> int:
    STAMPS.append(time.perf_counter())
    return i


@DBOS.workflow(name="bench_seq3")
async def seq3() -> int:
    a = await noop(1)
    b = await noop(2)
    c = await noop(3)
    return a + b + c


@DBOS.workflow(name="bench_fanout")
async def fanout(width: int) -> int:
    await noop(0)
    parts = await asyncio.gather(*(noop(i) for i in range(width)))
    await noop(1)
    return sum(parts)


@DBOS.workflow(name="bench_long")
async def long_stage(n: int) -> int:
    total = 0
    for i in range(n):
        total += await tick(i)
    return total


@DBOS.workflow(name="bench_signal")
async def wait_signal() -> Any:
    return await DBOS.recv_async("go", timeout_seconds=60)


def config(url: str) -> DBOSConfig:
    return {
        "name": "wfe-bench",
        "system_database_url": url,
        "log_level": "WARNING",
        # recv/get_result poll the database on SQLite (no LISTEN/NOTIFY); the default 1 s
        # would measure the poll interval, not DBOS
        "notification_listener_polling_interval_sec": 0.01,
    }


def launch(url: str, *, listen: bool) -> None:
    DBOS(config=config(url))
    if not listen:
        DBOS.listen_queues([])
    DBOS.launch()


def register_queue() -> None:
    DBOS.register_queue(QUEUE, polling_interval_sec=0.05, on_conflict="always_update")


async def register_queue_async() -> None:
    await DBOS.register_queue_async(QUEUE, polling_interval_sec=0.05, on_conflict="always_update")


def shutdown() -> None:
    DBOS.destroy(destroy_registry=False)
