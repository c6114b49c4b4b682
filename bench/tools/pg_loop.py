"""``python -m bench.tools.pg_loop [--runs N] [--batch B] [--signal]``: a native PostgreSQL
run (3-stage no-op, in-process worker; with ``--signal`` a parked run's ``signal()`` -> run
complete) with its transactions on a database thread (awaited through ``run_in_executor``)
against the same run with its transactions in greenlets on the event loop (``_pgloop``),
interleaved in batches of B runs in one process against one database, so that the load of a
shared machine falls on both sides alike. Prints p50 latency and process CPU per run for each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from engine_port import EngineSettings, create_engine

from .. import _workflows as W
from .._common import fresh_postgres_db


async def _one(engine: Any, signal: bool) -> float:
    if not signal:
        t0 = time.perf_counter()
        run = await engine.start("bench-seq3", {})
        await engine.wait(run.id, timeout=60)
        return time.perf_counter() - t0
    run = await engine.start("bench-signal", {})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = await engine.get_run(run.id)
        if info.stages and info.stages[0].status == "suspended":
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.02)  # (let the worker go idle)
    t0 = time.perf_counter()
    await engine.signal(run.id, "go", {"ok": True})
    await engine.wait(run.id, timeout=60)
    return time.perf_counter() - t0


async def main(runs: int, batch: int, signal: bool) -> None:
    with fresh_postgres_db() as url, tempfile.TemporaryDirectory() as blobs:
        settings = EngineSettings(database_url=url, blob_url=f"file://{blobs}")
        async with create_engine(settings, W.registry()) as engine:
            db = engine.kernel.db  # type: ignore[attr-defined]
            on_loop = db._loop_conns
            modes = {"thread": None, "loop": on_loop}
            samples: dict[str, list[float]] = {m: [] for m in modes}
            cpu: dict[str, float] = dict.fromkeys(modes, 0.0)
            async with engine.worker():
                for conns in modes.values():
                    db._loop_conns = conns
                    for _ in range(5):
                        await _one(engine, signal)
                done = 0
                while done < runs:
                    for mode, conns in modes.items():
                        db._loop_conns = conns
                        c0 = time.process_time()
                        for _ in range(batch):
                            samples[mode].append(await _one(engine, signal))
                        cpu[mode] += time.process_time() - c0
                    done += batch
            db._loop_conns = on_loop
    what = "signal() -> complete" if signal else "3-stage run"
    for mode, values in samples.items():
        cpu_note = "" if signal else f", CPU/run {cpu[mode] / len(values) * 1000:.2f} ms"
        print(
            f"{mode:6} {what}: p50 {statistics.median(values) * 1000:.2f} ms, "
            f"mean {statistics.fmean(values) * 1000:.2f} ms{cpu_note} ({len(values)} runs)"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--signal", action="store_true")
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.batch, args.signal))
