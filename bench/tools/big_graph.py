"""``python -m bench.tools.big_graph [--run 200,10000] [--migrate 2000] [--db sqlite,postgres]
[--temporal 1000,2000]``: big graphs on the native driver (and on Temporal).

Prints how long a 3,000-stage chain and a 10,000-stage wide graph take to define and to
register (``Registry`` + ``graph()``: validation and layering), and, for each width N given
to ``--run`` and each database of ``--db``, one run of a 1 -> N-1 wide graph (N stages) with
an in-process worker: its wall time (of it ``start()``'s: the run's creation), the wall time
and this process's CPU time per stage transition (neither should grow with N; CPU is the
steadier number on a shared machine). ``--migrate N``: a run of a 1 -> N-1 wide graph whose
stages each journal a step and wait for a signal, exported (frozen and read) and imported
into a second database: the time of each (neither should grow faster than N).
``--temporal N``: one run of a 1 -> N-1 wide graph on the Temporal driver (its own dev
server, an in-process worker): its wall time and its history's events and bytes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator

from engine_port import (
    EngineSettings,
    Registry,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
)

from .._common import fresh_postgres_db
from .._workflows import BenchIn


def build(n: int, *, wide: bool, waiting: bool = False) -> Workflow[BenchIn]:
    name = "waiting" if waiting else "wide" if wide else "chain"
    wf = Workflow(f"big-{name}-{n}", input=BenchIn)
    prev = None
    for i in range(n):

        async def body(ctx: StageContext[BenchIn]) -> int:
            if waiting and ctx.stage_id != "s0":
                await ctx.step.run("prep", lambda: 1)
                return int(await ctx.step.wait_for_signal(f"go-{ctx.stage_id}"))
            return 1

        body.__name__ = f"s{i}"
        after = [] if prev is None else [prev]
        stage = wf.stage(id=f"s{i}", after=after)(body)
        if not wide or prev is None:
            prev = stage
    return wf


def register(n: int, *, wide: bool) -> None:
    t0 = time.perf_counter()
    wf = build(n, wide=wide)
    t1 = time.perf_counter()
    Registry([wf])
    wf.graph()
    t2 = time.perf_counter()
    shape = "wide 1->N" if wide else "chain"
    print(f"{shape} {n:>6} stages: define {t1 - t0:.3f} s, register {t2 - t1:.3f} s")


@contextlib.contextmanager
def _database(db: str, folder: str) -> Iterator[str]:
    if db == "postgres":
        with fresh_postgres_db("bigwide") as url:
            yield url.replace("postgresql://", "postgresql+psycopg://", 1)
    else:
        yield f"sqlite:///{folder}/w.db"


async def run_wide(n: int, db: str = "sqlite") -> None:
    wf = build(n, wide=True)
    with tempfile.TemporaryDirectory() as d, _database(db, d) as url:
        settings = EngineSettings(database_url=url, blob_url=f"file://{d}/b")
        async with create_engine(settings, Registry([wf])) as engine, engine.worker():
            t0, cpu0 = time.perf_counter(), time.process_time()
            run = await engine.start(wf.id, {})
            started = time.perf_counter() - t0
            info = await engine.wait(run.id, timeout=3600)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(
        f"run wide 1->{n - 1} on {db}: {info.status} in {wall:.2f} s (start() {started:.3f} s), "
        f"{wall / n * 1000:.2f} ms wall and {cpu / n * 1000:.2f} ms CPU per stage transition"
    )


async def _until_suspended(engine: WorkflowEngine, run_id: str) -> None:
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        info = await engine.get_run(run_id)
        if all(s.status == "suspended" for s in info.stages[1:]):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the run's stages never all reached their signal waits")


async def migrate_wide(n: int, db: str = "sqlite") -> None:
    wf = build(n, wide=True, waiting=True)
    with (
        tempfile.TemporaryDirectory() as d,
        tempfile.TemporaryDirectory() as d_to,
        _database(db, d) as url,
        _database(db, d_to) as url_to,
    ):
        blobs = f"file://{d}/b"
        source = create_engine(EngineSettings(database_url=url, blob_url=blobs), Registry([wf]))
        target = create_engine(EngineSettings(database_url=url_to, blob_url=blobs), Registry([wf]))
        async with source, target:
            async with source.worker():
                run = await source.start(wf.id, {})
                await _until_suspended(source, run.id)
            t0 = time.perf_counter()
            snapshot = await source.export_run(run.id)
            t1 = time.perf_counter()
            await target.import_run(snapshot)
            t2 = time.perf_counter()
    print(
        f"migrate wide 1->{n - 1} (suspended) on {db}: export {t1 - t0:.3f} s, "
        f"import {t2 - t1:.3f} s"
    )


async def run_wide_temporal(n: int) -> None:
    from ._temporal_engine import driver_engine

    wf = build(n, wide=True)
    async with driver_engine(registry=Registry([wf])) as (engine, _server):
        t0 = time.perf_counter()
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=3600)
        wall = time.perf_counter() - t0
        history = await engine._conn.get_workflow_handle(run.id).fetch_history()
    size = sum(e.ByteSize() for e in history.events)
    print(
        f"run wide 1->{n - 1} on temporal: {info.status} in {wall:.1f} s, "
        f"{len(history.events)} history events, {size / 1e6:.1f} MB"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", default="", help="comma-separated widths to run (e.g. 200,10000)")
    ap.add_argument("--migrate", default="", help="comma-separated widths to export and import")
    ap.add_argument("--temporal", default="", help="comma-separated widths to run on Temporal")
    ap.add_argument("--db", default="sqlite", help="comma-separated: sqlite, postgres")
    args = ap.parse_args()
    register(3000, wide=False)
    register(10000, wide=True)
    for db in [d for d in args.db.split(",") if d]:
        for width in [int(w) for w in args.run.split(",") if w]:
            asyncio.run(run_wide(width, db))
        for width in [int(w) for w in args.migrate.split(",") if w]:
            asyncio.run(migrate_wide(width, db))
    for width in [int(w) for w in args.temporal.split(",") if w]:
        asyncio.run(run_wide_temporal(width))
