"""What the web view costs over the port (issue 18): ``python bench/tools/ui_pages.py [N]``.

Makes N pending runs (default 20,000) of a 3-stage workflow in a fresh PostgreSQL database on
the server at WFE_TEST_POSTGRES_URL (default 127.0.0.1:5432), then times, median of 5, each page
of ``wfe ui`` (through Starlette's TestClient, in process) and the bare port call behind it,
and prints both and their ratio (and what a TestClient round trip costs by itself). The runs
list can only ask the port for the newest ``limit`` runs (no cursor, no index on creation
time): see the README's *Web view* section.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pydantic import BaseModel
from starlette.testclient import TestClient

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from tests.support.databases import PostgresSession
from wfe_ui import create_app


class In(BaseModel):
    i: int


wf = Workflow("ui-bench", input=In, version="1")


@wf.stage
async def a(ctx: StageContext[In]) -> int:
    return 1


@wf.stage(after=[a])
async def b(ctx: StageContext[In]) -> int:
    return 2


@wf.stage(after=[b])
async def c(ctx: StageContext[In]) -> int:
    return 3


def median_ms(fn: Callable[[], Any], times: int = 5) -> float:
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


async def amedian_ms(fn: Callable[[], Awaitable[Any]], times: int = 5) -> float:
    samples = []
    for _ in range(times):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


async def fill(settings: EngineSettings, registry: Registry, n: int) -> str:
    async with create_engine(settings, registry) as engine:
        last = ""
        for i in range(0, n, 50):
            made = await asyncio.gather(
                *(engine.start("ui-bench", {"i": j}) for j in range(i, min(i + 50, n)))
            )
            last = made[-1].id
        return last


async def port_times(settings: EngineSettings, registry: Registry, run_id: str) -> dict[str, float]:
    async with create_engine(settings, registry) as engine:
        return {
            "/runs": await amedian_ms(lambda: engine.list_runs(limit=50)),
            "/runs?limit=200": await amedian_ms(lambda: engine.list_runs(limit=200)),
            "/runs?q=PREFIX": await amedian_ms(lambda: engine.list_runs(limit=500)),
            "/runs/ID": await amedian_ms(lambda: engine.get_run(run_id)),
        }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    pg = PostgresSession()
    try:
        settings = EngineSettings(database_url=pg.new_schema())
        registry = Registry([wf])
        t0 = time.perf_counter()
        run_id = asyncio.run(fill(settings, registry, n))
        print(f"{n} runs made in {time.perf_counter() - t0:.0f}s")
        port = asyncio.run(port_times(settings, registry, run_id))
        with TestClient(create_app(create_engine(settings, registry))) as client:
            pages = {
                "/runs": median_ms(lambda: client.get("/runs")),
                "/runs?limit=200": median_ms(lambda: client.get("/runs?limit=200")),
                "/runs?q=PREFIX": median_ms(lambda: client.get(f"/runs?q={run_id[:6]}")),
                "/runs/ID": median_ms(lambda: client.get(f"/runs/{run_id}")),
            }
            harness = median_ms(lambda: client.get("/static/style.css"))
        print(f"TestClient round trip of a static file (harness cost): {harness:.1f} ms")
        print(f"{'page':<18}{'page ms':>10}{'port ms':>10}{'ratio':>8}")
        for name, ms in pages.items():
            print(f"{name:<18}{ms:>10.1f}{port[name]:>10.1f}{ms / port[name]:>8.2f}")
    finally:
        pg.close()


if __name__ == "__main__":
    main()
