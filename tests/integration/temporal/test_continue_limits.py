"""Continue-as-new at Temporal's own limits: a run whose queued signals are more than a
continue-as-new can carry in one payload (2 MiB) still goes on in a new execution, and one
stage attempt takes more signals than Temporal lets one execution receive updates (2,000 on
the server's defaults) by suspending and continuing as new in between."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_temporal import TemporalDevServer
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine

from .conftest import EngineFactory
from .test_continue_as_new import continued, executions

pytestmark = pytest.mark.temporal

NOISE = 2_100  # signals of 1 KB queued: ~2.2 MB, over Temporal's 2 MiB payload limit
TAKES = 120  # signals one attempt takes: over the update limit of the server below
UPDATE_LIMIT = 50  # (``history.maxTotalUpdates`` of that server: 2,000 by default)


class In(BaseModel):
    n: int = 0


async def _send(engine: Any, run_id: str, name: str, count: int, first: int = 0) -> None:
    """``count`` signals ``name`` of ~1 KB, numbered from ``first``; the first two one after
    the other (the stage checks their order), the rest a few at a time."""
    gate = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with gate:
            await engine.signal(run_id, name, {"i": i, "pad": "x" * 1_000})

    for i in range(first, first + 2):
        await one(i)
    await asyncio.gather(*(one(i) for i in range(first + 2, first + count)))


async def test_continue_carries_more_than_a_payload_of_queued_signals(
    make_engine: EngineFactory,
) -> None:
    """2,100 signals of 1 KB queued while a stage waits for another one: once the run was at
    a safe point past ``continue_as_new_events``, each workflow task tried to continue as new
    carrying ~2.2 MB of them and failed (``PayloadsTooLarge``): the run made no progress,
    for ever if only such signals kept coming. Now the queued values past the carry budget go
    to the BlobStore behind references: the run continues, and the stage takes them intact."""
    released = asyncio.Event()
    wf = Workflow(f"can-carry-{uuid.uuid4().hex[:6]}", input=In)

    @wf.stage(signals=["go", "noise"])
    async def s(ctx: StageContext[In]) -> dict[str, Any]:
        async def hold() -> int:
            # the stage's activity is in flight (no safe point) while the noise queues
            await asyncio.wait_for(released.wait(), 300)
            return 1

        await ctx.step.run("hold", hold)
        go = await ctx.step.wait_for_signal("go", timeout=600)
        first = await ctx.step.wait_for_signal("noise", timeout=600)
        second = await ctx.step.wait_for_signal("noise", timeout=600)
        return {"go": go, "noise": [first["i"], len(first["pad"]), second["i"]]}

    engine = make_engine(
        Registry([wf]),
        max_pending_signals=NOISE + 100,
        options={"continue_as_new_events": 200},
    )
    async with engine.worker():
        run = await engine.start(wf.id, {})
        await _send(engine, run.id, "noise", NOISE)
        released.set()
        # the run continues as new (each of its workflow tasks failed to, for ever)
        await continued(engine, run.id)
        await engine.signal(run.id, "go", "ok")
        info = await engine.wait(run.id, timeout=120)
        assert info.status == "completed", info.error
        assert info.output == {"go": "ok", "noise": [0, 1_000, 1]}


@pytest.fixture(scope="module")
def few_updates_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalDevServer]:
    """A dev server of its own that lets an execution receive ``UPDATE_LIMIT`` updates (its
    default is 2,000: a test past that many takes would be slow)."""
    from tests.support.temporal import roomy_dev_server

    class FewUpdates(type(roomy_dev_server())):  # type: ignore[misc]
        def command(self) -> list[str]:
            limit = f"history.maxTotalUpdates={UPDATE_LIMIT}"
            return [*super().command(), "--dynamic-config-value", limit]

    log = tmp_path_factory.mktemp("few-updates") / "dev-server.log"
    server = FewUpdates(headless=True, log_file=log)
    asyncio.run(server.start())
    try:
        yield server
    finally:
        proc = getattr(server, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()  # (its state is in memory: no graceful stop to wait for)
        asyncio.run(server.stop())


async def test_one_attempt_takes_more_signals_than_updates_allowed(
    few_updates_server: TemporalDevServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each signal a running attempt takes is a Temporal update, and Temporal lets one
    execution receive only so many (2,000 by default): the attempt hung at the next take
    (a running stage is no safe point, so the run could not continue as new), where the
    native driver takes them all. Now the take answers "suspend" once the execution handled
    ``TAKES_PER_EXECUTION`` takes (1,500; lowered here with the server's limit): the attempt
    suspends with what it took journaled, the run continues as new, and the attempt resumes
    there."""
    monkeypatch.setattr(
        "driver_temporal._start.TAKES_PER_EXECUTION", UPDATE_LIMIT - 10, raising=False
    )
    released = asyncio.Event()
    wf = Workflow(f"can-takes-{uuid.uuid4().hex[:6]}", input=In)

    @wf.stage(signals=["go"])
    async def s(ctx: StageContext[In]) -> list[int]:
        async def hold() -> int:
            # the attempt runs (no safe point) while the signals queue
            await asyncio.wait_for(released.wait(), 300)
            return 1

        await ctx.step.run("hold", hold)
        got = []
        for _ in range(TAKES):
            sig = await ctx.step.wait_for_signal("go", timeout=600)
            got.append(int(sig["i"]))
        return got

    settings = EngineSettings(
        driver="temporal",
        temporal_address=few_updates_server.address,
        task_queue=f"takes-{uuid.uuid4().hex[:8]}",
        blob_url=f"file://{tmp_path / 'blobs'}",
    )
    async with create_engine(settings, Registry([wf])) as engine, engine.worker():
        run = await engine.start(wf.id, {})
        await _send(engine, run.id, "go", TAKES)
        released.set()
        info = await engine.wait(run.id, timeout=120)
        assert info.status == "completed", info.error
        assert sorted(info.output) == list(range(TAKES))
        assert info.output[:2] == [0, 1]
        # it went on in new executions, none refused a take: each took what it may
        assert len(await executions(engine, run.id)) >= TAKES // (UPDATE_LIMIT - 10)


async def test_attempt_takes_more_than_a_payload_of_signals(make_engine: EngineFactory) -> None:
    """Each signal an attempt takes is journaled in its stage's ledger, which its result
    carries: an attempt that took 50 signals of 45 KB (each under the spill threshold)
    reported a 2.3 MB result, which Temporal refused, and the run never ended (at 2,000
    signals of 1 KB, so did the probe's). Now the ledger's values past a budget go to the
    BlobStore; the stage still reads them all."""
    count, size = 50, 45_000
    wf = Workflow(f"big-takes-{uuid.uuid4().hex[:6]}", input=In)

    @wf.stage(signals=["go"])
    async def s(ctx: StageContext[In]) -> list[int]:
        got = []
        for _ in range(count):
            sig = await ctx.step.wait_for_signal("go", timeout=600)
            assert len(sig["pad"]) == size
            got.append(int(sig["i"]))
        return got

    engine = make_engine(Registry([wf]))
    async with engine.worker():
        run = await engine.start(wf.id, {})
        gate = asyncio.Semaphore(4)

        async def one(i: int) -> None:
            async with gate:
                await engine.signal(run.id, "go", {"i": i, "pad": "x" * size})

        await asyncio.gather(*(one(i) for i in range(count)))
        info = await engine.wait(run.id, timeout=90)
        assert info.status == "completed", info.error
        assert sorted(info.output) == list(range(count))
        steps = [e for e in await engine.steps(run.id) if e.stage == "s" and e.completed]
        assert len(steps) == count
