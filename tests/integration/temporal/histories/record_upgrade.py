"""Record, on the code of <tree>, the histories ``test_upgrade_replay.py`` replays on the current
code, with the events the run handed to its sink: ``PYTHONPATH=<tree> python record_upgrade.py
OUT_DIR [scenario ...]`` (its own Temporal dev server). Each file holds ``workflow_id``,
``history`` (one execution) and ``events`` (the sink's events of the run, as JSON).

- ``gap_repeat``: a run that continues as new (``continue_as_new_events=1``) while its stage
  ``s`` waits for its second ``go``; ``go`` 1 was sent (delivery id D) before the continue and
  taken. In the gap the same send of ``go`` 1 arrives again (delivery D: a sender's retry of a
  signal RPC that reached the server), then ``go`` 2 with key k2 and its retry. The history is
  the second execution's, whose first task handled those signals.
- ``held_sleep``: a young execution (``continue_as_new_events=1``) whose only stage sleeps 2 s:
  it continues as soon as the stage suspends. The history is the first execution's.
- ``suspends``: a stage that starts on signal ``go`` (``after_signal``, suspended by the
  workflow), then a stage that suspends twice (a 0.3 s sleep, then a wait for ``b``), with
  values whose keys are not sorted (input, signal payloads, outputs, a business event; the
  body changes the values it reads). The whole run.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import driver_temporal._engine as engine_module
from driver_temporal import create_temporal_engine
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    MemorySink,
    Registry,
    StageContext,
    Workflow,
)
from tests.support.temporal import roomy_dev_server


class In(BaseModel):
    model_config = {"extra": "allow"}
    n: int = 0


async def until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"timed out: {what}")
        await asyncio.sleep(0.02)


_FIXED: contextvars.ContextVar[Any] = contextvars.ContextVar("fixed", default=None)
DELIVERY = uuid.UUID("0" * 31 + "d")


class _FixedDelivery:
    """``uuid`` for the engine module, whose ``uuid4`` returns ``_FIXED`` in a context that set
    it (the engine's delivery id of a signal: the same send arriving twice)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(uuid, name)

    def uuid4(self) -> Any:
        return _FIXED.get() or uuid.uuid4()


def _with_delivery(coro: Any) -> asyncio.Future[Any]:
    """``coro`` as a task whose signal goes with delivery id ``DELIVERY``."""
    token = _FIXED.set(DELIVERY)
    try:
        return asyncio.ensure_future(coro)
    finally:
        _FIXED.reset(token)


def build(scenario: str, flags: dict[str, bool]) -> Workflow[In]:
    wf = Workflow(f"upgrade-{scenario}", input=In)
    if scenario == "gap_repeat":

        @wf.stage
        async def s1(ctx: StageContext[In]) -> str:
            for _ in range(1200):  # until the recorder sent go 1 (D)
                if flags.get("sent"):
                    break
                await asyncio.sleep(0.01)
            return "ok"

        @wf.stage(after=[s1], signals=["go", "end"])
        async def s2(ctx: StageContext[In]) -> Any:
            got = [await ctx.step.wait_for_signal("go") for _ in range(2)]
            await ctx.step.wait_for_signal("end")
            return got

    elif scenario == "held_sleep":

        @wf.stage
        async def nap(ctx: StageContext[In]) -> str:
            await ctx.step.sleep("nap", timedelta(seconds=2))
            return "rested"

    else:

        @wf.stage(after_signal="go", signals=["go", "b"])
        async def gate(ctx: StageContext[In]) -> Any:
            got = await ctx.step.wait_for_signal("go")
            got["seen"] = True  # (changes the value it read)
            return {"zeta": got, "alpha": ctx.input.model_dump()}

        @wf.stage(after=[gate], signals=["b"])
        async def twice(ctx: StageContext[In]) -> Any:
            up = ctx.output_of("gate")
            up["changed"] = 1
            await ctx.step.sleep("nap", timedelta(seconds=0.3))
            b = await ctx.step.wait_for_signal("b")
            ctx.emit("upgrade.seen", {"y": b, "x": up})
            return {"b": b, "a": up}

    return wf


async def record(scenario: str, server: Any, out: Path) -> None:
    flags: dict[str, bool] = {}
    blobs = Path(tempfile.mkdtemp())
    wf = build(scenario, flags)
    sink = MemorySink()
    settings = EngineSettings(
        driver="temporal",
        temporal_address=server.address,
        task_queue=f"u-{uuid.uuid4().hex[:8]}",
        blob_url=f"file://{blobs}",
    )
    extra = {} if scenario == "suspends" else {"continue_as_new_events": 1}
    engine = create_temporal_engine(
        settings, Registry([wf]), event_sink=sink, blob_store=FolderBlobStore(blobs), **extra
    )
    engine_module.uuid = _FixedDelivery()  # type: ignore[assignment]

    def seen(etype: str, stage: str | None = None) -> bool:
        return any(e.type == etype and stage in (None, e.stage) for e in sink.for_run(run.id))

    async with engine, engine.worker():
        conn = engine._conn
        run = await engine.start(wf.id, {"n": 1, "zulu": {"b": 2, "a": 1}})
        first = (await conn.get_workflow_handle(run.id).describe()).run_id
        which = first
        if scenario == "gap_repeat":
            await _with_delivery(engine.signal(run.id, "go", {"v": 1}))
            flags["sent"] = True

            async def went_on() -> bool:
                return (await conn.get_workflow_handle(run.id).describe()).run_id != first

            await until(went_on, "the continue")
            which = (await conn.get_workflow_handle(run.id).describe()).run_id
            sends = [_with_delivery(engine.signal(run.id, "go", {"v": 1}))]
            await asyncio.sleep(0.2)  # (a recording, not a test: the repeat reaches it first)
            sends += [
                asyncio.ensure_future(engine.signal(run.id, "go", {"v": 2}, idempotency_key="k2")),
                asyncio.ensure_future(engine.signal(run.id, "go", {"v": 2}, idempotency_key="k2")),
            ]
            print([(r.delivered, r.already_completed) for r in await asyncio.gather(*sends)])
            await engine.signal(run.id, "end", {})
        elif scenario == "held_sleep":
            pass
        else:
            await until(lambda: _true(seen("stage.suspended", "gate")), "gate suspended")
            await engine.signal(run.id, "go", {"q": 1, "p": 2})
            await until(
                lambda: _true(sum(e.type == "stage.suspended" for e in sink.for_run(run.id)) == 3),
                "twice waits for b",
            )
            await engine.signal(run.id, "b", {"k": [{"n": 1, "m": 2}], "j": None})
        info = await engine.wait(run.id, timeout=60)
        await until(lambda: _true(seen("run.completed")), "run.completed handed")
        print(
            scenario,
            info.status,
            info.output,
            [f"{e.type}:{e.stage}" for e in sink.for_run(run.id)],
        )
        history = await conn.get_workflow_handle(run.id, run_id=which).fetch_history()
    events = [e.model_dump(mode="json") for e in sink.for_run(run.id)]
    data = {"workflow_id": run.id, "history": json.loads(history.to_json()), "events": events}
    out.write_text(json.dumps(data))  # noqa: ASYNC240 (a one-off script)


async def _true(value: bool) -> bool:
    return value


async def main(folder: Path, scenarios: list[str]) -> None:
    server = roomy_dev_server(headless=True)
    await server.start()
    try:
        for scenario in scenarios:
            await record(scenario, server, folder / f"{scenario}.json")
    finally:
        await server.stop()


if __name__ == "__main__":
    names = sys.argv[2:] or ["gap_repeat", "held_sleep", "suspends"]
    asyncio.run(main(Path(sys.argv[1]), names))
