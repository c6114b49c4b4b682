"""``python -m bench.tools.step_growth [--repeat N]``: the long-stage workload (1,000 durable
steps) on the native driver over PostgreSQL, with the growth of the per-step cost measured both
as the bench does (10-step windows) and over 100-step windows (steps 6-105 vs the last 100)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile

from engine_port import EngineSettings, create_engine

from .. import _workflows as W
from .._common import fresh_postgres_db
from .._native import long_stage
from .._systems import SYSTEMS, sizes_for


async def main(repeat: int) -> None:
    sizes = sizes_for(SYSTEMS["native-postgres"], quick=False)
    with fresh_postgres_db() as url, tempfile.TemporaryDirectory() as d:
        settings = EngineSettings(
            database_url=url.replace("postgresql://", "postgresql+psycopg://", 1),
            blob_url=f"file://{d}",
        )
        async with create_engine(settings, W.registry()) as engine, engine.worker():
            for _ in range(repeat):
                out = await long_stage(engine, sizes)
                diffs = [(b - a) * 1000 for a, b in itertools.pairwise(W.STAMPS)]
                early, late = statistics.median(diffs[5:105]), statistics.median(diffs[-100:])
                print(
                    f"bench growth {out['growth']:.2f}; 100-step windows: "
                    f"{early:.3f} ms -> {late:.3f} ms = {late / early:.2f}"
                )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    asyncio.run(main(ap.parse_args().repeat))
