"""Purge cost on a folder blob store (issue 11, item 6): ``python bench/tools/purge.py [N]``.

Makes N completed runs (default 1,200) whose spilled input, step result and output sit in a
``file://`` store, then times ``engine.purge(0)`` and the longest stall of the event loop while
it runs (a task ticking every 10 ms records its largest gap). SQLite, in a temp folder.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from driver_native import NativeEngine, process_available_jobs
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine


class Big(BaseModel):
    pad: str


wf = Workflow("purge-bench", input=Big, version="1")


@wf.stage
async def echo(ctx: StageContext[Big]) -> str:
    return ctx.input.pad  # spilled again as the output


def _count_files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = EngineSettings(
            database_url=f"sqlite:///{Path(tmp) / 'wfe.db'}", blob_url=f"file://{tmp}/blobs"
        )
        async with create_engine(settings, Registry([wf])) as engine:
            assert isinstance(engine, NativeEngine)
            t0 = time.monotonic()
            for _ in range(n):
                await engine.start(wf.id, {"pad": "x" * (70 * 1024)})
            while (await process_available_jobs(engine.kernel, 200)).processed:
                pass
            files = await asyncio.to_thread(_count_files, Path(tmp, "blobs"))
            print(f"{n} runs made in {time.monotonic() - t0:.1f}s; {files} blob files")
            gaps: list[float] = []
            stop = asyncio.Event()

            async def tick() -> None:
                last = time.monotonic()
                while not stop.is_set():
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.create_task(tick())
            t0 = time.monotonic()
            purged = await engine.purge(older_than_seconds=0)
            took = time.monotonic() - t0
            stop.set()
            await ticker
            print(f"purged {purged} runs in {took:.2f}s; longest event-loop stall {max(gaps):.2f}s")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1200))
