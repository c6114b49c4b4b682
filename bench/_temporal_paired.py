"""The Temporal driver and hand-written temporalio *paired*: issue 13's four 1.1x ratios from
samples taken in alternation in one process, so both sides see the same load.

The ``temporal-driver`` and ``temporal-raw`` systems each run alone, minutes apart; on a shared
machine whose speed drifts over minutes (steal time, other tenants) their ratio swung by 0.3-0.5
between two sets of the same code (``bench/README.md``, 2026-12-03), far more than the 1.1x
being judged. Here both dev servers and both in-process workers run at once, and every sample of
one side is followed by one of the other (A B, then B A, ...), each after the bench's pause; the
throughput bursts alternate the same way (driver, raw, raw, driver), each with its two worker
processes; ``local`` pairs the driver's ``local=True`` 3-stage run with the hand-written one's
regular activities (issue 13: at least 2x faster). Each cell keeps both sides' numbers, the
ratio of their p50s (driver cost / hand-written cost) and the median of the per-pair ratios."""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ._common import Sizes, guarded, pause, settle
from ._temporal import _driver_throughput, _raw_throughput, dev_server

__all__ = ["run_temporal_paired"]

Sample = Callable[[], Awaitable[float]]  # one timed sample, in seconds


async def _pairs(sizes: Sizes, n: int, driver: Sample, raw: Sample) -> dict[str, Any]:
    """``n`` pairs of samples after ``sizes.warmup`` untimed ones of each side, alternating
    which side goes first; lower is better."""
    for _ in range(sizes.warmup):
        await driver()
        await raw()
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(n):
        await pause(sizes)
        if i % 2:
            y = await raw()
            await pause(sizes)
            x = await driver()
        else:
            x = await driver()
            await pause(sizes)
            y = await raw()
        ours.append(x * 1000)
        theirs.append(y * 1000)
    return _cell(ours, theirs, "p50_ms", higher_is_better=False)


def _cell(
    ours: list[float], theirs: list[float], metric: str, *, higher_is_better: bool
) -> dict[str, Any]:
    a, b = statistics.median(ours), statistics.median(theirs)
    pair = [(y / x) if higher_is_better else (x / y) for x, y in zip(ours, theirs, strict=True)]
    return {
        metric: a,
        f"raw_{metric}": b,
        "ratio": (b / a) if higher_is_better else (a / b),  # driver cost / hand-written cost
        "pair_ratio_p50": statistics.median(pair),
        "n": len(ours),
        "driver": ours,  # every sample of each side, in order
        "raw": theirs,
    }


async def _bursts(
    engine: Any, driver_address: str, raw_address: str, blobs: str, sizes: Sizes
) -> dict[str, Any]:
    """Four throughput bursts in the order driver, raw, raw, driver."""
    ours: list[float] = []
    theirs: list[float] = []
    for driver_first in (True, False):
        for side in ("driver", "raw") if driver_first else ("raw", "driver"):
            if side == "driver":
                res = await _driver_throughput(engine, driver_address, blobs, sizes)
                ours.append(res["runs_per_s"])
            else:
                res = await _raw_throughput(raw_address, sizes)
                theirs.append(res["runs_per_s"])
    return _cell(ours, theirs, "runs_per_s", higher_is_better=True)


async def run_temporal_paired(sizes: Sizes) -> dict[str, Any]:
    from engine_port import EngineSettings, create_engine

    from . import _temporal_raw as R
    from . import _workflows as W
    from ._native import signal_once

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-paired-") as d:
        blobs = f"file://{Path(d) / 'blobs'}"
        async with dev_server() as ours, dev_server() as theirs:
            settings = EngineSettings(
                driver="temporal", temporal_address=ours, blob_url=blobs, task_queue="bench"
            )
            async with create_engine(settings, W.registry()) as engine:
                async with engine.worker(), R.worker(theirs) as client:

                    async def driver_run(wf: str) -> float:
                        t0 = time.perf_counter()
                        run = await engine.start(wf, {})
                        info = await engine.wait(run.id, timeout=300)
                        if info.status != "completed":
                            raise RuntimeError(f"run ended {info.status}: {info.error}")
                        return time.perf_counter() - t0

                    async def raw_run(wf: str, arg: Any) -> float:
                        t0 = time.perf_counter()
                        await client.execute_workflow(
                            wf, arg, id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
                        )
                        return time.perf_counter() - t0

                    async def raw_signal() -> float:
                        handle = await client.start_workflow(
                            "bench_signal", id=uuid.uuid4().hex, task_queue=R.TASK_QUEUE
                        )
                        await handle.query("waiting")
                        await pause(sizes)
                        t0 = time.perf_counter()
                        await handle.signal("go", {"ok": True})
                        await handle.result()
                        return time.perf_counter() - t0

                    fanout = f"bench-fanout-{sizes.fanout_width}"
                    await settle(sizes)
                    await guarded(
                        out,
                        "latency",
                        lambda: _pairs(
                            sizes,
                            sizes.latency_runs,
                            lambda: driver_run("bench-seq3"),
                            lambda: raw_run("bench_seq3", False),
                        ),
                    )
                    await guarded(  # issue 13: local=True stages >= 2x hand-written activities
                        out,
                        "local",
                        lambda: _pairs(
                            sizes,
                            sizes.latency_runs,
                            lambda: driver_run("bench-seq3-local"),
                            lambda: raw_run("bench_seq3", False),
                        ),
                    )
                    await guarded(
                        out,
                        "fanout",
                        lambda: _pairs(
                            sizes,
                            sizes.fanout_runs,
                            lambda: driver_run(fanout),
                            lambda: raw_run("bench_fanout", sizes.fanout_width),
                        ),
                    )
                    await guarded(
                        out,
                        "signal",
                        lambda: _pairs(
                            sizes, sizes.signal_runs, lambda: signal_once(engine, sizes), raw_signal
                        ),
                    )

                # the in-process workers are gone: each side's two worker processes serve
                # its task queue
                await guarded(
                    out, "throughput", lambda: _bursts(engine, ours, theirs, blobs, sizes)
                )
    return out
