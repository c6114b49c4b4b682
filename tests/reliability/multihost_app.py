"""The app that multi-host test worker processes run: ``python -m tests.reliability.multihost_app
URL DIR``. It serves the workflows below on the database at URL until DIR/stop exists.

Each process plays a host of its own:

- ``MH_SKEW=<seconds>``: this host's wall clock runs that far ahead (negative: behind) of the
  database's: ``time.time`` and the engine's system clock are shifted (what a host whose NTP
  is broken sees), the monotonic clock is not.
- ``MH_VERSIONS=1,2``: the versions of ``mh-ver`` this host has deployed (default both).

Every step or stage body appends one line ``<pid> <run id> <what>`` to DIR/counts with
O_APPEND (one write per line), outside the engine.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel

from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine

SKEW = float(os.environ.get("MH_SKEW", "0"))
if SKEW:
    import engine_port._clock

    _real_time = time.time

    def _skewed_time() -> float:
        return _real_time() + SKEW

    def _skewed_now(self: object) -> datetime:
        return datetime.fromtimestamp(_real_time(), UTC) + timedelta(seconds=SKEW)

    time.time = _skewed_time
    engine_port._clock.SystemClock.now = _skewed_now  # type: ignore[method-assign]


class MhIn(BaseModel):
    nap: float = 0.0


def _dir() -> Path:
    return Path(os.environ["MH_DIR"])


def record(run_id: str, what: str) -> None:
    line = f"{os.getpid()} {run_id} {what}\n".encode()
    fd = os.open(_dir() / "counts", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


nap = Workflow("mh-nap", input=MhIn, version="1")


@nap.stage
async def sleeper(ctx: StageContext[MhIn]) -> str:
    record(ctx.run_id, "before")
    await ctx.step.sleep("nap", ctx.input.nap)
    record(ctx.run_id, "after")
    return "rested"


fence = Workflow("mh-fence", input=MhIn, version="1")


@fence.stage(id="b")
async def fence_b(ctx: StageContext[MhIn]) -> str:
    def step_x() -> str:
        record(ctx.run_id, "x")
        return "x"

    def step_y() -> str:
        record(ctx.run_id, "y")
        return "y"

    x = await ctx.step.run("x", step_x)
    (_dir() / f"marker-{os.getpid()}").write_text(ctx.run_id)
    # the test opens the gate (DIR/go, then DIR/go2 after step y) once it has paused this
    # process or locked what it needs. The waits hold the
    # event loop (a stage doing blocking work): resumed, the body goes on at once, before
    # any heartbeat of this worker could find the lease gone
    _gate("go")
    y = await ctx.step.run("y", step_y)
    (_dir() / f"after-y-{os.getpid()}").write_text(ctx.run_id)
    _gate("go2")
    return x + y


def _gate(name: str) -> None:
    while not (_dir() / name).exists():
        time.sleep(0.02)


@fence.stage(id="c", after=["b"])
async def fence_c(ctx: StageContext[MhIn]) -> str:
    record(ctx.run_id, "c")
    return str(ctx.output_of("b")) + "c"


comp = Workflow("mh-comp", input=MhIn, version="1")


@comp.stage(id="a")
async def comp_a(ctx: StageContext[MhIn]) -> str:
    return "a"


@comp_a.compensation
async def undo_a(ctx: StageContext[MhIn], output: str) -> None:
    """Steps ux and uy, gated as ``mh-fence``'s stage b is (DIR/cgo, then DIR/cgo2)."""

    def step(name: str) -> str:
        record(ctx.run_id, name)
        return name

    await ctx.step.run("ux", step, "ux")
    (_dir() / f"cmarker-{os.getpid()}").write_text(ctx.run_id)
    _gate("cgo")
    await ctx.step.run("uy", step, "uy")
    _gate("cgo2")


@comp.stage(id="b", after=["a"], retry=Retry(max_attempts=1))
async def comp_b(ctx: StageContext[MhIn]) -> str:
    raise RuntimeError("b fails for good: the run compensates a")


def _versioned(version: str) -> Workflow[MhIn]:
    wf = Workflow("mh-ver", input=MhIn, version=version)

    @wf.stage(id="s")
    async def s(ctx: StageContext[MhIn]) -> str:
        record(ctx.run_id, f"v{version}")
        return f"v{version}"

    return wf


VERSIONS = os.environ.get("MH_VERSIONS", "1,2").split(",")
registry = Registry([nap, fence, comp, *(_versioned(v) for v in VERSIONS)])


def settings(url: str, work: Path, lease_seconds: float = 30.0) -> EngineSettings:
    return EngineSettings(database_url=url, lease_seconds=lease_seconds)


async def serve(url: str, work: Path) -> None:
    lease = float(os.environ.get("MH_LEASE_SECONDS", "30"))
    engine = create_engine(settings(url, work, lease), registry)
    async with engine, engine.worker(maintenance_interval=0.2):  # type: ignore[attr-defined]
        (work / f"ready-{os.getpid()}").write_text("ready")
        # the stop signal is a file another process writes: no asyncio.Event can carry it
        while not (work / "stop").exists():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], Path(sys.argv[2])))
