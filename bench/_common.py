"""Shared pieces: workload sizes, timing helpers, result cells."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "WORKLOADS",
    "Sizes",
    "combine_rounds",
    "fresh_postgres_db",
    "guarded",
    "native_database",
    "pause",
    "pct",
    "settle",
    "step_growth",
    "summary_ms",
]

WORKLOADS = ("latency", "throughput", "fanout", "long_stage", "signal")

PG_ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. ``slow`` systems (Temporal) use fewer samples for the
    per-run latency workloads so a full bench stays within ~15 minutes."""

    latency_runs: int = 200
    throughput_runs: int = 1000
    fanout_width: int = 50
    fanout_runs: int = 5
    long_steps: int = 1000
    signal_runs: int = 30
    warmup: int = 5
    # idle time before each timed latency, fan-out and signal sample. On Temporal a run that
    # starts right after the previous one ended waits ~40 ms more per workflow task for
    # dispatch (hand-written temporalio: 3-stage run ~200 ms back to back, ~70 ms after a
    # 0.2-0.5 s pause; bench/README.md), which hid most of the driver's cost
    pause_s: float = 0.0
    # idle time after the workers start, before the first timed workload (both sides alike).
    # A Temporal worker's start keeps the dev server busy for seconds (the driver registers a
    # Worker Deployment version per served version and makes it current: ~118 ms/s of server
    # CPU in the first 5 s against 6-8 ms/s after; bench.tools.temporal_cpu --settle), which
    # the first samples paid as per-run cost
    settle_s: float = 0.0

    @classmethod
    def full(cls, slow: bool = False) -> Sizes:
        if slow:
            # (issue 13 compares these with hand-written temporalio within 10 %: 3 fan-outs
            # and 10 signals moved the ratios by 2-3x between two runs on the shared machine)
            return cls(
                latency_runs=50, fanout_runs=7, signal_runs=30, warmup=3, pause_s=0.5, settle_s=10.0
            )
        return cls()

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            latency_runs=3,
            throughput_runs=10,
            fanout_width=5,
            fanout_runs=1,
            long_steps=20,
            signal_runs=1,
            warmup=1,
        )


async def settle(sizes: Sizes) -> None:
    """The idle time after workers start (``Sizes.settle_s``)."""
    if sizes.settle_s > 0:
        await asyncio.sleep(sizes.settle_s)


async def pause(sizes: Sizes) -> None:
    """The idle time before a timed sample (``Sizes.pause_s``)."""
    if sizes.pause_s > 0:
        await asyncio.sleep(sizes.pause_s)


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank on the sorted samples)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))
    return s[k]


def summary_ms(samples_s: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in samples_s]
    return {
        "p50_ms": pct(ms, 50),
        "p99_ms": pct(ms, 99),
        "mean_ms": statistics.fmean(ms) if ms else float("nan"),
        "n": len(ms),
    }


def combine_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's result from the rounds of ``python -m bench --rounds N``: per workload,
    each number is the median of that number over the rounds the workload ran in (``n`` and
    ``wall_s`` add up); a workload that failed in every round keeps its first error. The
    cells of each round stay under ``per_round``."""
    out: dict[str, Any] = {}
    for wl in dict.fromkeys(k for r in rounds for k in r):
        cells = [r[wl] for r in rounds if wl in r]
        ok = [c for c in cells if "error" not in c]
        if not ok:
            out[wl] = cells[0]
            continue
        cell: dict[str, Any] = {}
        for key, first in ok[0].items():
            values = [c[key] for c in ok if isinstance(c.get(key), int | float)]
            if isinstance(first, bool) or not isinstance(first, int | float) or not values:
                cell[key] = first
            elif key in ("n", "wall_s"):
                cell[key] = sum(values)
            else:
                cell[key] = statistics.median(values)
        cell["rounds"] = len(ok)
        cell["per_round"] = ok
        out[wl] = cell
    return out


def step_growth(stamps: list[float]) -> dict[str, Any]:
    """Per-step cost from the wall-clock time at which each step body ran: the cost of step
    i is stamps[i] - stamps[i-1] (it includes journaling step i-1). Step "10" is the median
    over steps 6-15 and step "1000" the median over the last 10 steps (for tiny runs: the
    first and the last quarter). Every system runs a 50-step warm-up stage first."""
    diffs = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    n = len(diffs)
    if n == 0:
        return {"error": "no steps were timed"}
    if n >= 100:
        early, late = diffs[5:15], diffs[-10:]
    else:
        q = max(1, n // 4)
        early, late = diffs[:q], diffs[-q:]
    e, l_ = statistics.median(early), statistics.median(late)
    return {
        "per_step_ms": statistics.median(diffs),
        "mean_step_ms": statistics.fmean(diffs),
        "step10_ms": e,
        "step1000_ms": l_,
        "growth": l_ / e if e > 0 else float("nan"),
        "n_steps": n + 1,
        "total_ms": (stamps[-1] - stamps[0]) * 1000,
    }


async def guarded(
    out: dict[str, Any], workload: str, fn: Callable[[], Awaitable[dict[str, Any]]]
) -> None:
    """Run one workload; record its numbers, or why it could not run."""
    t0 = time.perf_counter()
    try:
        out[workload] = await fn()
    except BaseException as exc:  # record and carry on with the next workload
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        tb = traceback.format_exception(exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        out[workload] = {
            "error": f"{type(exc).__name__}: {first}",
            "traceback": "".join(tb[-6:]),
        }
    out[workload]["wall_s"] = round(time.perf_counter() - t0, 3)


@contextlib.contextmanager
def fresh_postgres_db(prefix: str = "bench") -> Iterator[str]:
    """A new, empty PostgreSQL database for one system; dropped afterwards. Yields a
    ``postgresql://`` URL."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def native_database(backend: str) -> Iterator[str]:
    """A fresh database for a native engine: a SQLite file in a temporary folder, or a new
    PostgreSQL database (``sqlite`` | ``postgres``); yields its SQLAlchemy URL."""
    if backend == "postgres":
        with fresh_postgres_db() as url:
            yield url.replace("postgresql://", "postgresql+psycopg://", 1)
    else:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/wfe.db"
