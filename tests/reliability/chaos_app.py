"""The app the chaos test's worker processes run: ``python -m tests.reliability.chaos_app URL
DIR``. It serves the ``chaos`` workflow on the database at URL until DIR/stop exists.

``chaos`` has three stages in a row, each with two durable steps and ``max_attempts=1`` (so
any storage fault charged to a stage fails its run). Every step body appends one line
``<pid> <run id> <stage>.<step> <token>`` to DIR/counts with O_APPEND (one write per line),
outside the engine, before it returns ``token`` (unique per execution); a stage returns the
tokens its steps journaled, so the test can tell which execution was journaled.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

from pydantic import BaseModel

from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine


class ChaosIn(BaseModel):
    i: int = 0


def _record(run_id: str, what: str, token: str) -> None:
    line = f"{os.getpid()} {run_id} {what} {token}\n".encode()
    fd = os.open(Path(os.environ["CHAOS_DIR"]) / "counts", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


async def _two_steps(ctx: StageContext[ChaosIn]) -> list[str]:
    tokens = []
    for step in ("s1", "s2"):

        def body(step: str = step) -> str:
            token = uuid.uuid4().hex[:12]
            _record(ctx.run_id, f"{ctx.stage_id}.{step}", token)
            return token

        tokens.append(str(await ctx.step.run(step, body)))
    return tokens


chaos = Workflow("chaos", input=ChaosIn, version="1")
ONCE = Retry(max_attempts=1)


@chaos.stage(retry=ONCE)
async def a(ctx: StageContext[ChaosIn]) -> list[str]:
    return await _two_steps(ctx)


@chaos.stage(after=[a], retry=ONCE)
async def b(ctx: StageContext[ChaosIn]) -> list[str]:
    return await _two_steps(ctx)


@chaos.stage(after=[b], retry=ONCE)
async def c(ctx: StageContext[ChaosIn]) -> list[str]:
    return await _two_steps(ctx)


registry = Registry([chaos])


def settings(url: str, work: Path, lease_seconds: float) -> EngineSettings:
    return EngineSettings(
        database_url=url, blob_url=f"file://{work / 'blobs'}", lease_seconds=lease_seconds
    )


async def serve(url: str, work: Path) -> None:
    lease = float(os.environ.get("CHAOS_LEASE_SECONDS", "3"))
    engine = create_engine(settings(url, work, lease), registry)
    async with engine, engine.worker(maintenance_interval=0.2):  # type: ignore[attr-defined]
        (work / f"ready-{os.getpid()}").write_text("ready")
        # the stop signal is a file another process writes: no asyncio.Event can carry it
        while not (work / "stop").exists():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], Path(sys.argv[2])))
