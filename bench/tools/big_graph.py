"""``python -m bench.tools.big_graph [--run 200,1000]``: big graphs on the native driver.

Prints how long a 3,000-stage chain and a 10,000-stage wide graph take to define and to
register (``Registry`` + ``graph()``: validation and layering), and, for each width given to
``--run``, the wall time of one run of a 1 -> N wide graph on SQLite with an in-process
worker and the time per stage transition (which should not grow with N)."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine

from .._workflows import BenchIn


def build(n: int, *, wide: bool) -> Workflow[BenchIn]:
    wf = Workflow(f"big-{'wide' if wide else 'chain'}-{n}", input=BenchIn)
    prev = None
    for i in range(n):

        async def body(ctx: StageContext[BenchIn]) -> int:
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


async def run_wide(n: int) -> None:
    wf = build(n, wide=True)
    with tempfile.TemporaryDirectory() as d:
        settings = EngineSettings(database_url=f"sqlite:///{d}/w.db", blob_url=f"file://{d}/b")
        async with create_engine(settings, Registry([wf])) as engine, engine.worker():
            t0 = time.perf_counter()
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=3600)
            wall = time.perf_counter() - t0
    print(
        f"run wide 1->{n - 1}: {info.status} in {wall:.2f} s, "
        f"{wall / n * 1000:.2f} ms per stage transition"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", default="", help="comma-separated widths to run (e.g. 200,1000)")
    args = ap.parse_args()
    register(3000, wide=False)
    register(10000, wide=True)
    for width in [int(w) for w in args.run.split(",") if w]:
        asyncio.run(run_wide(width))
