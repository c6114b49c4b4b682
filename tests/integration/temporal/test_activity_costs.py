"""What a short stage attempt costs besides its body, counted: heartbeats, BlobStore calls,
memo writes (issue 13: the driver's fixed cost per stage against hand-written temporalio)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio import activity
from temporalio.api.enums.v1 import EventType

from driver_temporal import create_temporal_engine
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    MemorySink,
    Registry,
    StageContext,
    Workflow,
)

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


class CountingStore(FolderBlobStore):
    """A folder store that counts its calls by kind."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: list[tuple[str, str]] = []

    async def put(self, key: str, data: bytes) -> None:
        self.calls.append(("put", key))
        await super().put(key, data)

    async def get(self, key: str) -> bytes:
        self.calls.append(("get", key))
        return await super().get(key)

    async def list(self, prefix: str = "") -> list[str]:
        self.calls.append(("list", prefix))
        return await super().list(prefix)


def _registry(slow_s: float = 0.0) -> Registry:
    wf = Workflow("costs", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        await asyncio.sleep(slow_s)
        return 1

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> dict[str, int]:
        return {"b": ctx.output_of("a") + 1}

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


@pytest.fixture
def beats(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts ``activity.heartbeat`` calls of this process's workers."""
    counted: list[int] = []
    real = activity.heartbeat

    def counting(*details: object) -> None:
        counted.append(1)
        real(*details)

    monkeypatch.setattr(activity, "heartbeat", counting)
    return counted


async def test_a_short_stage_costs_no_heartbeat_blob_call_or_extra_memo_write(
    temporal_address: str, blob_dir: Path, beats: list[int]
) -> None:
    store = CountingStore(blob_dir)
    engine = create_temporal_engine(
        _settings(temporal_address, blob_dir),
        _registry(),
        event_sink=MemorySink(),
        blob_store=store,
        heartbeat_timeout=3.0,
    )
    async with engine, engine.worker():
        run = await engine.start("costs", {})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed", info.error
        handle = engine._conn.get_workflow_handle(run.id)
        await asyncio.wait_for(handle.result(), 60)
        history = [e.event_type for e in (await handle.fetch_history()).events]
    # a stage that ends well within the heartbeat interval sends no heartbeat (each was an
    # RPC and a write of the activity's state on the server; 3 per run before)
    assert beats == []
    # small values inline, no step, a sink: the one BlobStore call of the run is the final
    # state wfe.save_state stores for redrive (no journal look-up, no spill, no parking)
    assert [kind for kind, _ in store.calls] == ["put"], store.calls
    # the memo is written at most once per workflow task
    tasks = history.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    memos = history.count(EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED)
    assert 1 <= memos <= tasks, (memos, tasks)


async def test_a_long_stage_still_heartbeats(
    temporal_address: str, blob_dir: Path, beats: list[int]
) -> None:
    engine = create_temporal_engine(
        _settings(temporal_address, blob_dir),
        _registry(slow_s=2.0),
        blob_store=FolderBlobStore(blob_dir),
        heartbeat_timeout=3.0,  # a beat every 0.75 s
    )
    async with engine, engine.worker():
        run = await engine.start("costs", {})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed", info.error
    assert len(beats) >= 1, beats  # about every 0.75 s of stage a
