"""The app that reliability-test worker processes run: ``python -m tests.reliability.app URL
DIR``. It serves the workflows below on the database at URL until DIR/stop exists.

Every stage body appends one line ``<pid> <run id> <what>`` to DIR/counts with O_APPEND (one
write per line, so concurrent processes never interleave), outside the engine. With
``REL_BLOCK_B=1`` stage b of ``rel-crash`` writes DIR/marker after step x and then blocks, so
the test can SIGKILL the process there.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from pydantic import BaseModel

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine


class RelIn(BaseModel):
    i: int = 0


def _dir() -> Path:
    return Path(os.environ["REL_DIR"])


def record(run_id: str, what: str) -> None:
    line = f"{os.getpid()} {run_id} {what}\n".encode()
    fd = os.open(_dir() / "counts", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


three = Workflow("rel-three", input=RelIn, version="1")


@three.stage
async def a(ctx: StageContext[RelIn]) -> int:
    record(ctx.run_id, "a")
    return ctx.input.i


@three.stage(after=[a])
async def b(ctx: StageContext[RelIn]) -> int:
    record(ctx.run_id, "b")
    return int(ctx.output_of(a)) + 1


@three.stage(after=[b])
async def c(ctx: StageContext[RelIn]) -> int:
    record(ctx.run_id, "c")
    return int(ctx.output_of(b)) + 1


crash = Workflow("rel-crash", input=RelIn, version="1")


@crash.stage(id="a")
async def crash_a(ctx: StageContext[RelIn]) -> str:
    record(ctx.run_id, "a")
    return "a"


@crash.stage(id="b", after=["a"])
async def crash_b(ctx: StageContext[RelIn]) -> str:
    record(ctx.run_id, "b")

    def step_x() -> str:
        record(ctx.run_id, "x")
        return "x"

    def step_y() -> str:
        record(ctx.run_id, "y")
        return "y"

    x = await ctx.step.run("x", step_x)
    if os.environ.get("REL_BLOCK_B") == "1":
        (_dir() / "marker").write_text(ctx.run_id)
        await asyncio.sleep(3600)  # killed here
    y = await ctx.step.run("y", step_y)
    return x + y


@crash.stage(id="c", after=["b"])
async def crash_c(ctx: StageContext[RelIn]) -> str:
    record(ctx.run_id, "c")
    return str(ctx.output_of("b")) + "c"


registry = Registry([three, crash])


def settings(url: str, work: Path, lease_seconds: float = 30.0) -> EngineSettings:
    return EngineSettings(
        database_url=url, blob_url=f"file://{work / 'blobs'}", lease_seconds=lease_seconds
    )


async def serve(url: str, work: Path) -> None:
    lease = float(os.environ.get("REL_LEASE_SECONDS", "30"))
    engine = create_engine(settings(url, work, lease), registry)
    async with engine, engine.worker(maintenance_interval=0.2):  # type: ignore[attr-defined]
        (work / f"ready-{os.getpid()}").write_text("ready")
        # the stop signal is a file another process writes: no asyncio.Event can carry it
        while not (work / "stop").exists():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], Path(sys.argv[2])))
