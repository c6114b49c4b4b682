"""``python -m bench.tools.big_graph [--run 200,10000] [--db sqlite,postgres]``: big graphs
on the native driver.

Prints how long a 3,000-stage chain and a 10,000-stage wide graph take to define and to
register (``Registry`` + ``graph()``: validation and layering), and, for each width N given
to ``--run`` and each database of ``--db``, one run of a 1 -> N-1 wide graph (N stages) with
an in-process worker: its wall time (of it ``start()``'s: the run's creation), the wall time
and this process's CPU time per stage transition (neither should grow with N; CPU is the
steadier number on a shared machine)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine

from .._common import fresh_postgres_db
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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", default="", help="comma-separated widths to run (e.g. 200,10000)")
    ap.add_argument("--db", default="sqlite", help="comma-separated: sqlite, postgres")
    args = ap.parse_args()
    register(3000, wide=False)
    register(10000, wide=True)
    for db in [d for d in args.db.split(",") if d]:
        for width in [int(w) for w in args.run.split(",") if w]:
            asyncio.run(run_wide(width, db))
