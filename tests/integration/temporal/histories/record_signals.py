"""Record the history of a parallel group with signals, for ``test_signal_replay.py``:
``python record_signals.py resume|buffered OUT`` with the tree to record on in PYTHONPATH.

- resume: gate -> {x takes buffered c, then a step held by the test; y waits for b}; b is sent
  while x is in its step, then x is released (the single-taker rule keeps y suspended).
- timeout: as resume, but y waits for b with a 3 s timeout (caught) and x is released once y
  completed (the single-taker rule lets y time out although b came).
- buffered: two signals a buffered before gate -> {x waits for a, y waits for a} (the
  single-taker rule makes y suspend once and resume after x returned).
"""
import asyncio, json, sys, tempfile, uuid
from datetime import timedelta
from engine_port.errors import StepTimeoutError
from pathlib import Path
from driver_temporal import create_temporal_engine
from engine_port import EngineSettings, FolderBlobStore, MemorySink, Registry, Retry, StageContext, Workflow
from pydantic import BaseModel
from tests.support.temporal import roomy_dev_server

class Num(BaseModel):
    n: int = 0

flags: dict[str, bool] = {}

async def until(check, what, t=60.0):
    loop = asyncio.get_running_loop(); end = loop.time() + t
    while not check():
        if loop.time() > end:
            raise AssertionError(what)
        await asyncio.sleep(0.05)

def build(scenario: str) -> Workflow:
    wf = Workflow(f"history-{scenario}", input=Num)
    once = Retry(max_attempts=1)
    @wf.stage(retry=once)
    async def gate(ctx: StageContext[Num]) -> str:
        await until(lambda: flags.get("gate", False), "gate")
        return "open"
    if scenario == "buffered":
        @wf.stage(after=[gate], retry=once)
        async def x(ctx: StageContext[Num]) -> object:
            return await ctx.step.wait_for_signal("a")

        @wf.stage(after=[gate], retry=once)
        async def y(ctx: StageContext[Num]) -> object:
            return await ctx.step.wait_for_signal("a")

        return wf

    @wf.stage(after=[gate], retry=once)
    async def x(ctx: StageContext[Num]) -> object:
        took = await ctx.step.wait_for_signal("c")
        async def held() -> str:
            flags["x-step"] = True
            await until(lambda: flags.get("release", False), "release")
            return "released"
        return {"took": took, "step": await ctx.step.run("held", held)}
    @wf.stage(after=[gate], retry=once)
    async def y(ctx: StageContext[Num]) -> object:
        if scenario == "timeout":
            try:
                return await ctx.step.wait_for_signal("b", timeout=timedelta(seconds=3))
            except StepTimeoutError:
                return "timed out"
        return await ctx.step.wait_for_signal("b")

    return wf

async def main(scenario: str, out: str) -> None:
    server = roomy_dev_server(headless=True)
    await server.start()
    tmp = Path(tempfile.mkdtemp())
    try:
        wf = build(scenario); sink = MemorySink()
        s = EngineSettings(driver="temporal", temporal_address=server.address,
                           task_queue=f"h-{uuid.uuid4().hex[:8]}", blob_url=f"file://{tmp}")
        engine = create_temporal_engine(s, Registry([wf]), event_sink=sink, blob_store=FolderBlobStore(tmp))
        async with engine, engine.worker():
            run = await engine.start(wf.id, {})
            await until(lambda: any(e.type == "stage.started" and e.stage == "gate" for e in sink.for_run(run.id)), "gate started")
            if scenario == "buffered":
                await engine.signal(run.id, "a", {"n": 1})
                await engine.signal(run.id, "a", {"n": 2})
                flags["gate"] = True
                info = await engine.wait(run.id, timeout=60)
                print("status", info.status, [e.type + ":" + str(e.stage) for e in sink.for_run(run.id)])
                hist = await engine._conn.get_workflow_handle(run.id).fetch_history()
                Path(out).write_text(json.dumps({"workflow_id": run.id, "history": json.loads(hist.to_json())}))
                return
            await engine.signal(run.id, "c", {"early": True})
            flags["gate"] = True
            await until(lambda: flags.get("x-step") and any(e.type == "stage.suspended" and e.stage == "y" for e in sink.for_run(run.id)), "x in step, y suspended")
            await engine.signal(run.id, "b", {"late": True})
            if scenario == "timeout":
                await until(lambda: any(e.type == "stage.completed" and e.stage == "y" for e in sink.for_run(run.id)), "y completed")
            await asyncio.sleep(1.0)  # old code: y stays suspended (the holder); new: y completes
            y_done_first = any(e.type == "stage.completed" and e.stage == "y" for e in sink.for_run(run.id))
            flags["release"] = True
            info = await engine.wait(run.id, timeout=60)
            print("status", info.status, "y completed while x held:", y_done_first)
            hist = await engine._conn.get_workflow_handle(run.id).fetch_history()
            Path(out).write_text(json.dumps({"workflow_id": run.id, "history": json.loads(hist.to_json())}))
    finally:
        await server.stop()

asyncio.run(main(sys.argv[1], sys.argv[2]))
