"""Record the history of a parallel group with signals, for ``test_signal_replay.py``:
``PYTHONPATH=<tree> python record_signals.py buffered|resume|timeout OUT`` records on the code
of <tree> (its own Temporal dev server).

- buffered: two signals a buffered before gate -> {x waits for a, y waits for a} (the
  single-taker rule made y suspend once and resume after x returned).
- resume: gate -> {x takes buffered c, then a step held by this script; y waits for b}; b is
  sent while x is in its step, then x is released (the single-taker rule kept y suspended).
- timeout: as resume, but y waits for b with a 3 s timeout (caught) and x is released once y
  completed (the single-taker rule let y time out although b came).
- chain: gate -> x -> y -> z, all three ``local=True`` (one local activity for the chain): x
  takes the buffered signal c, y runs a journaled step and fails its first attempt (its retry
  is a local activity of its own, which goes on with z), z emits an event.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from driver_temporal import create_temporal_engine
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    MemorySink,
    Registry,
    Retry,
    StageContext,
    Workflow,
)
from engine_port.errors import StepTimeoutError
from tests.support.temporal import roomy_dev_server


class Num(BaseModel):
    n: int = 0


async def until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out: {what}")
        await asyncio.sleep(0.05)


def build(scenario: str, flags: dict[str, bool]) -> Workflow[Num]:
    wf = Workflow(f"history-{scenario}", input=Num)
    once = Retry(max_attempts=1)

    @wf.stage(retry=once)
    async def gate(ctx: StageContext[Num]) -> str:
        await until(lambda: flags.get("gate", False), "gate")
        return "open"

    if scenario == "chain":
        return _chain(wf, gate)

    if scenario == "buffered":

        @wf.stage(id="x", after=[gate], retry=once)
        async def xa(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("a")

        @wf.stage(id="y", after=[gate], retry=once)
        async def ya(ctx: StageContext[Num]) -> Any:
            return await ctx.step.wait_for_signal("a")

        return wf

    @wf.stage(after=[gate], retry=once)
    async def x(ctx: StageContext[Num]) -> Any:
        took = await ctx.step.wait_for_signal("c")

        async def held() -> str:
            flags["x-step"] = True
            await until(lambda: flags.get("release", False), "release")
            return "released"

        return {"took": took, "step": await ctx.step.run("held", held)}

    @wf.stage(after=[gate], retry=once)
    async def y(ctx: StageContext[Num]) -> Any:
        if scenario == "timeout":
            try:
                return await ctx.step.wait_for_signal("b", timeout=timedelta(seconds=3))
            except StepTimeoutError:
                return "timed out"
        return await ctx.step.wait_for_signal("b")

    return wf


def _chain(wf: Workflow[Num], gate: Any) -> Workflow[Num]:
    @wf.stage(after=[gate], local=True, retry=Retry(max_attempts=1))
    async def x(ctx: StageContext[Num]) -> Any:
        return await ctx.step.wait_for_signal("c")

    @wf.stage(after=[x], local=True, retry=Retry(max_attempts=2, initial_interval=timedelta(0)))
    async def y(ctx: StageContext[Num]) -> Any:
        async def stamp() -> str:
            return f"stamped in attempt {ctx.attempt}"

        took = await ctx.step.run("stamp", stamp)
        if ctx.attempt == 1:
            raise RuntimeError("y fails its first attempt")
        return {"took": took, "x": ctx.output_of("x")}

    @wf.stage(after=[y], local=True, retry=Retry(max_attempts=1))
    async def z(ctx: StageContext[Num]) -> str:
        ctx.emit("chain.done", {"y": ctx.output_of("y")})
        return "done"

    return wf


async def main(scenario: str, out: Path) -> None:
    flags: dict[str, bool] = {}
    server = roomy_dev_server(headless=True)
    await server.start()
    blobs = Path(tempfile.mkdtemp())
    try:
        wf = build(scenario, flags)
        sink = MemorySink()
        settings = EngineSettings(
            driver="temporal",
            temporal_address=server.address,
            task_queue=f"h-{uuid.uuid4().hex[:8]}",
            blob_url=f"file://{blobs}",
        )
        engine = create_temporal_engine(
            settings, Registry([wf]), event_sink=sink, blob_store=FolderBlobStore(blobs)
        )

        def seen(etype: str, stage: str) -> bool:
            return any(e.type == etype and e.stage == stage for e in sink.for_run(run.id))

        async with engine, engine.worker():
            run = await engine.start(wf.id, {})
            await until(lambda: seen("stage.started", "gate"), "gate started")
            if scenario == "chain":
                await engine.signal(run.id, "c", {"early": True})
                flags["gate"] = True
            elif scenario == "buffered":
                await engine.signal(run.id, "a", {"n": 1})
                await engine.signal(run.id, "a", {"n": 2})
                flags["gate"] = True
            else:
                await engine.signal(run.id, "c", {"early": True})
                flags["gate"] = True
                await until(
                    lambda: flags.get("x-step") and seen("stage.suspended", "y"),
                    "x in its step, y suspended",
                )
                await engine.signal(run.id, "b", {"late": True})
                if scenario == "timeout":
                    await until(lambda: seen("stage.completed", "y"), "y completed")
                else:
                    await asyncio.sleep(1.0)  # a recording, not a test: let y resume or not
                flags["release"] = True
            info = await engine.wait(run.id, timeout=60)
            print(info.status, [f"{e.type}:{e.stage}" for e in sink.for_run(run.id)])
            history = await engine._conn.get_workflow_handle(run.id).fetch_history()
        data = {"workflow_id": run.id, "history": json.loads(history.to_json())}
        out.write_text(json.dumps(data))  # noqa: ASYNC240 (a one-off script)
    finally:
        await server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
