"""DBOS Transact on SQLite and on a fresh PostgreSQL database, the same workloads."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ._common import Sizes, fresh_postgres_db, guarded, step_growth, summary_ms
from ._procs import worker_processes

__all__ = ["run_dbos"]


async def _latency(sizes: Sizes) -> dict[str, Any]:
    from dbos import DBOS

    from . import _dbos_app as A

    samples = []
    for i in range(sizes.warmup + sizes.latency_runs):
        t0 = time.perf_counter()
        h = await DBOS.start_workflow_async(A.seq3)
        await h.get_result()
        if i >= sizes.warmup:
            samples.append(time.perf_counter() - t0)
    return summary_ms(samples)


async def _fanout(sizes: Sizes) -> dict[str, Any]:
    from dbos import DBOS

    from . import _dbos_app as A

    samples = []
    for _ in range(sizes.fanout_runs):
        t0 = time.perf_counter()
        h = await DBOS.start_workflow_async(A.fanout, sizes.fanout_width)
        await h.get_result()
        samples.append(time.perf_counter() - t0)
    out = summary_ms(samples)
    out["width"] = sizes.fanout_width
    return out


async def _long(sizes: Sizes) -> dict[str, Any]:
    from dbos import DBOS

    from . import _dbos_app as A

    warm = await DBOS.start_workflow_async(A.long_stage, min(50, sizes.long_steps))
    await warm.get_result()  # warm-up, as for every system
    A.STAMPS.clear()
    t0 = time.perf_counter()
    h = await DBOS.start_workflow_async(A.long_stage, sizes.long_steps)
    await h.get_result()
    wall = time.perf_counter() - t0
    out = step_growth(list(A.STAMPS))
    out["run_ms"] = wall * 1000
    return out


async def _signal(sizes: Sizes) -> dict[str, Any]:
    from dbos import DBOS

    from . import _dbos_app as A

    samples = []
    for _ in range(sizes.signal_runs):
        h = await DBOS.start_workflow_async(A.wait_signal)
        # the workflow is waiting in recv once its status row exists and it ran a moment
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        await DBOS.send_async(h.workflow_id, {"ok": True}, "go")
        await h.get_result()
        samples.append(time.perf_counter() - t0)
    return summary_ms(samples)


def _status_table(url: str) -> sa.Table:
    md = sa.MetaData(schema=None if url.startswith("sqlite") else "dbos")
    return sa.Table(
        "workflow_status",
        md,
        sa.Column("workflow_uuid", sa.Text),
        sa.Column("status", sa.Text),
        sa.Column("queue_name", sa.Text),
    )


async def _throughput(url: str, sizes: Sizes) -> dict[str, Any]:
    from dbos import DBOS

    from . import _dbos_app as A

    n = sizes.throughput_runs
    table = _status_table(url)
    eng = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))

    def done() -> int:
        with eng.connect() as c:
            return int(
                c.execute(
                    sa.select(sa.func.count())
                    .select_from(table)
                    .where(table.c.status == "SUCCESS", table.c.queue_name == A.QUEUE)
                ).scalar_one()
            )

    try:
        async with worker_processes("dbos", {"url": url}):
            queue = await DBOS.retrieve_queue_async(A.QUEUE)
            assert queue is not None
            t0 = time.perf_counter()
            for _ in range(n):
                await queue.enqueue_async(A.seq3)
            started = time.perf_counter() - t0
            deadline = time.monotonic() + 600
            while await asyncio.to_thread(done) < n:
                if time.monotonic() > deadline:
                    raise TimeoutError("DBOS runs did not complete within 600 s")
                await asyncio.sleep(0.02)
            dt = time.perf_counter() - t0
    finally:
        eng.dispose()
    return {"runs_per_s": n / dt, "seconds": dt, "start_s": started, "n": n, "workers": 2}


async def _run_all(out: dict[str, Any], url: str, sizes: Sizes) -> None:
    from . import _dbos_app as A

    A.launch(url, listen=False)
    await A.register_queue_async()
    try:
        await guarded(out, "latency", lambda: _latency(sizes))
        await guarded(out, "fanout", lambda: _fanout(sizes))
        await guarded(out, "long_stage", lambda: _long(sizes))
        await guarded(out, "signal", lambda: _signal(sizes))
        await guarded(out, "throughput", lambda: _throughput(url, sizes))
    finally:
        A.shutdown()


async def run_dbos(backend: str, sizes: Sizes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-dbos-") as d:
            await _run_all(out, f"sqlite:///{Path(d) / 'dbos.db'}", sizes)
    else:
        with fresh_postgres_db("bench_dbos") as url:
            await _run_all(out, url, sizes)
    return out
