"""Events of a worker with no sink: parked in the BlobStore one batch per blob, delivered in
order, each once, by ``flush_events()`` of an engine with a sink."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_temporal import create_temporal_engine
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    MemorySink,
    Registry,
    StageContext,
    Workflow,
)

from .conftest import trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


class CountingStore(FolderBlobStore):
    """A folder store that remembers the key of every write."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts: list[str] = []

    async def put(self, key: str, data: bytes) -> None:
        self.puts.append(key)
        await super().put(key, data)


def _seq3() -> Registry:
    wf = Workflow("parked-seq3", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        return 2

    @wf.stage(after=[b])
    async def c(ctx: StageContext[In]) -> int:
        return 3

    return Registry([wf])


def _settings(temporal_address: str, blob_dir: Path) -> EngineSettings:
    return EngineSettings(
        driver="temporal",
        temporal_address=temporal_address,
        task_queue=f"t-{uuid.uuid4().hex[:10]}",
        blob_url=f"file://{blob_dir}",
    )


async def _sinkless_seq3(settings: EngineSettings, store: FolderBlobStore) -> Any:
    """A 3-stage run on a worker without an event sink, on ``store``, until its execution
    closed; the run."""
    sinkless = create_temporal_engine(settings, _seq3(), blob_store=store)
    async with sinkless, sinkless.worker():
        run = await sinkless.start("parked-seq3", {})
        info = await sinkless.wait(run.id, timeout=60)
        assert info.status == "completed", info.error
        await asyncio.wait_for(sinkless._conn.get_workflow_handle(run.id).result(), 60)
    return run


async def test_a_sinkless_worker_parks_a_batch_per_blob(
    temporal_address: str, blob_dir: Path
) -> None:
    settings = _settings(temporal_address, blob_dir)
    store = CountingStore(blob_dir)
    run = await _sinkless_seq3(settings, store)
    parked = [k for k in store.puts if k.startswith("outbox/")]
    # 9 events, carried by the 3 stage activities and wfe.save_state; the stages end within
    # PARK_AFTER_S, so each hands its batch back and wfe.save_state parks all 9 in one blob
    # (one blob per batch, 4, before; one per event, 9, before that)
    assert parked == [f"outbox/{run.id}/0000000001-to-0000000009.json"], parked

    sink = MemorySink()
    flusher = create_temporal_engine(
        settings, _seq3(), event_sink=sink, blob_store=FolderBlobStore(blob_dir)
    )
    async with flusher:
        flushed = await flusher.flush_events()
        assert flushed.published == 9
        assert (await flusher.flush_events()).published == 0
    assert trace(sink, run) == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("stage.completed", "a"),
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("stage.started", "c"),
        ("stage.completed", "c"),
        ("run.completed", None),
    ]
    assert [k for k in await FolderBlobStore(blob_dir).list("outbox/")] == []


class ThreadNotingStore(FolderBlobStore):
    """A folder store (its own ``put``) that notes the thread of every file it writes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        # (key, written where the caller ran: the event loop's thread, or the workflow's
        # thread of the run's last task; not a worker thread of ``to_thread``)
        self.writes: list[tuple[str, bool]] = []

    def put_now(self, key: str, data: bytes) -> None:
        here = threading.current_thread()
        caller = here is threading.main_thread() or here.name.startswith("temporal_workflow_")
        self.writes.append((key, caller))
        super().put_now(key, data)


async def test_parked_events_and_the_final_state_are_written_without_a_thread_hop(
    temporal_address: str, blob_dir: Path
) -> None:
    """On a folder store a small parked batch (in a stage activity, on its critical path) and
    the final state (in the run's last workflow task) are written where they are made, the
    event loop or the workflow's own thread, as the step journal is: no ``to_thread`` hop
    (~1 ms on a busy worker) per write."""
    store = ThreadNotingStore(blob_dir)
    run = await _sinkless_seq3(_settings(temporal_address, blob_dir), store)
    ours = [w for w in store.writes if w[0].startswith(("outbox/", f"runs/{run.id}/state"))]
    assert any(k.startswith("outbox/") for k, _ in ours), store.writes
    assert any(k.endswith("state.json") for k, _ in ours), store.writes
    assert all(inline for _, inline in ours), ours


def _slow_seq2(seconds: float) -> Registry:
    wf = Workflow("parked-slow", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(after=[a])
    async def slow(ctx: StageContext[In]) -> int:
        await asyncio.sleep(seconds)
        return 2

    return Registry([wf])


async def test_a_slow_stage_parks_the_events_it_carries_while_it_runs(
    temporal_address: str, blob_dir: Path
) -> None:
    """A sinkless worker hands a fast stage's events back to the run, but parks those a slow
    stage carries once it has run ``PARK_AFTER_S``: another engine's ``flush_events()``
    delivers them while the stage still runs (they are not held until the run's end)."""
    settings = _settings(temporal_address, blob_dir)
    sinkless = create_temporal_engine(
        settings, _slow_seq2(2.0), blob_store=FolderBlobStore(blob_dir)
    )
    sink = MemorySink()
    flusher = create_temporal_engine(
        settings, _slow_seq2(2.0), event_sink=sink, blob_store=FolderBlobStore(blob_dir)
    )
    async with sinkless, sinkless.worker(), flusher:
        run = await sinkless.start("parked-slow", {})
        deadline = asyncio.get_running_loop().time() + 30
        while ("stage.started", "slow") not in trace(sink, run):
            assert asyncio.get_running_loop().time() < deadline, trace(sink, run)
            await flusher.flush_events()
            await asyncio.sleep(0.05)
        assert (await sinkless.get_run(run.id)).status == "running"
        assert trace(sink, run) == [
            ("run.created", None),
            ("run.started", None),
            ("stage.started", "a"),
            ("stage.completed", "a"),
            ("stage.started", "slow"),
        ]
        info = await sinkless.wait(run.id, timeout=60)
        assert info.status == "completed", info.error
        await asyncio.wait_for(sinkless._conn.get_workflow_handle(run.id).result(), 60)
        await flusher.flush_events()
    assert trace(sink, run)[5:] == [("stage.completed", "slow"), ("run.completed", None)]
