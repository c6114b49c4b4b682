"""Our native driver (SQLite file or a fresh PostgreSQL database), through the public port."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from engine_port import EngineSettings, WorkflowEngine, create_engine

from . import _workflows as W
from ._common import Sizes, fresh_postgres_db, guarded, pause, settle, step_growth, summary_ms
from ._procs import worker_processes

__all__ = ["run_engine_workloads", "run_native"]


async def latency(engine: WorkflowEngine, wf: str, sizes: Sizes) -> dict[str, Any]:
    samples = []
    for i in range(sizes.warmup + sizes.latency_runs):
        await pause(sizes)
        t0 = time.perf_counter()
        run = await engine.start(wf, {})
        info = await engine.wait(run.id, timeout=60)
        dt = time.perf_counter() - t0
        if info.status != "completed":
            raise RuntimeError(f"run ended {info.status}: {info.error}")
        if i >= sizes.warmup:
            samples.append(dt)
    return summary_ms(samples)


async def fanout(engine: WorkflowEngine, sizes: Sizes) -> dict[str, Any]:
    wf = f"bench-fanout-{sizes.fanout_width}"
    samples = []
    for _ in range(sizes.fanout_runs):
        await pause(sizes)
        t0 = time.perf_counter()
        run = await engine.start(wf, {})
        info = await engine.wait(run.id, timeout=300)
        samples.append(time.perf_counter() - t0)
        if info.status != "completed":
            raise RuntimeError(f"run ended {info.status}: {info.error}")
    out = summary_ms(samples)
    out["width"] = sizes.fanout_width
    return out


async def long_stage(engine: WorkflowEngine, sizes: Sizes) -> dict[str, Any]:
    # one short warm-up run first: the first stage of a process pays one-off costs (fresh
    # blob directories, connection and page caches) that are not history-dependent
    warm = await engine.start("bench-long", {"n": min(50, sizes.long_steps)})
    await engine.wait(warm.id, timeout=600)
    W.STAMPS.clear()
    t0 = time.perf_counter()
    run = await engine.start("bench-long", {"n": sizes.long_steps})
    info = await engine.wait(run.id, timeout=600)
    wall = time.perf_counter() - t0
    if info.status != "completed":
        raise RuntimeError(f"run ended {info.status}: {info.error}")
    out = step_growth(list(W.STAMPS))
    out["run_ms"] = wall * 1000
    return out


async def _until_waiting(engine: WorkflowEngine, run_id: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = await engine.get_run(run_id)
        if info.stages and info.stages[0].status == "suspended":
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the run never reached its signal wait")


async def signal_once(engine: WorkflowEngine, sizes: Sizes) -> float:
    """One signal round trip, in seconds: a run parked in its signal wait, the pause, then
    ``signal()`` until ``wait()`` returns."""
    run = await engine.start("bench-signal", {})
    await _until_waiting(engine, run.id)
    await pause(sizes)
    t0 = time.perf_counter()
    await engine.signal(run.id, "go", {"ok": True})
    info = await engine.wait(run.id, timeout=60)
    dt = time.perf_counter() - t0
    if info.status != "completed":
        raise RuntimeError(f"run ended {info.status}: {info.error}")
    return dt


async def signal(engine: WorkflowEngine, sizes: Sizes) -> dict[str, Any]:
    return summary_ms([await signal_once(engine, sizes) for _ in range(sizes.signal_runs)])


async def run_engine_workloads(
    out: dict[str, Any],
    engine: WorkflowEngine,
    sizes: Sizes,
    *,
    throughput: Any,
    local_only: bool = False,
    seq_wf: str = "bench-seq3",
) -> None:
    """The in-process workloads on a connected engine with a worker in this process."""
    async with engine.worker():
        await settle(sizes)
        await guarded(out, "latency", lambda: latency(engine, seq_wf, sizes))
        if local_only:
            return
        await guarded(out, "fanout", lambda: fanout(engine, sizes))
        await guarded(out, "long_stage", lambda: long_stage(engine, sizes))
        await guarded(out, "signal", lambda: signal(engine, sizes))
    await guarded(out, "throughput", throughput)


async def _count_completed(engine: Any) -> int:
    from driver_native._schema import runs

    def q(conn: sa.Connection) -> int:
        return int(
            conn.execute(
                sa.select(sa.func.count()).select_from(runs).where(runs.c.status == "completed")
            ).scalar_one()
        )

    # an autocommit read, as DBOS's count is: a write transaction here took SQLite's writer
    # lock every 20 ms from the worker processes being measured
    n: int = await engine.kernel.db.read(q)
    return n


async def native_throughput(engine: Any, db_url: str, blobs: str, sizes: Sizes) -> dict[str, Any]:
    n = sizes.throughput_runs
    before = await _count_completed(engine)
    async with worker_processes("native", {"db": db_url, "blobs": blobs}):
        sem = asyncio.Semaphore(16)

        async def start_one() -> None:
            async with sem:
                await engine.start("bench-seq3", {})

        t0 = time.perf_counter()
        await asyncio.gather(*(start_one() for _ in range(n)))
        started = time.perf_counter() - t0
        deadline = time.monotonic() + 600
        while await _count_completed(engine) - before < n:
            if time.monotonic() > deadline:
                raise TimeoutError("runs did not complete within 600 s")
            await asyncio.sleep(0.02)
        dt = time.perf_counter() - t0
    return {"runs_per_s": n / dt, "seconds": dt, "start_s": started, "n": n, "workers": 2}


@contextlib.asynccontextmanager
async def _database(backend: str, tmp: Path) -> AsyncIterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'wfe.db'}"
    else:
        with fresh_postgres_db("bench_native") as url:
            yield url.replace("postgresql://", "postgresql+psycopg://", 1)


async def run_native(backend: str, sizes: Sizes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-native-") as d:
        tmp = Path(d)
        async with _database(backend, tmp) as db_url:
            blobs = f"file://{tmp / 'blobs'}"
            settings = EngineSettings(driver="native", database_url=db_url, blob_url=blobs)
            async with create_engine(settings, W.registry()) as engine:
                await run_engine_workloads(
                    out,
                    engine,
                    sizes,
                    throughput=lambda: native_throughput(engine, db_url, blobs, sizes),
                )
    return out
