"""Storage faults are not stage failures on Temporal either (DESIGN §5): a blob store write of
the step journal that fails during a stage attempt abandons the attempt; the activity is
retried under the same stage attempt, with the journaled steps replayed."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from pydantic import BaseModel

from driver_temporal import create_temporal_engine
from engine_port import (
    EngineSettings,
    MemoryBlobStore,
    MemorySink,
    Registry,
    Retry,
    StageContext,
    Workflow,
)

from .conftest import trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


class FlakyStore(MemoryBlobStore):
    """Its first write of step two's journal record fails, as an unreachable store would."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0

    async def put(self, key: str, data: bytes) -> None:
        if "/steps/" in key and key.endswith("/two.json") and not self.failed:
            self.failed += 1
            raise OSError("blob store unreachable")
        await super().put(key, data)


async def test_a_journal_write_fault_keeps_the_attempt(temporal_address: str) -> None:
    ran: Counter[str] = Counter()
    wf = Workflow("faults-temporal", input=In)

    @wf.stage(retry=Retry(max_attempts=1))
    async def s(ctx: StageContext[In]) -> str:
        def one() -> str:
            ran["one"] += 1
            return "one"

        def two() -> str:
            ran["two"] += 1
            return "two"

        return str(await ctx.step.run("one", one)) + str(await ctx.step.run("two", two))

    store = FlakyStore()
    sink = MemorySink()
    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_address,
        task_queue=f"t-{uuid.uuid4().hex[:10]}",
        blob_url="memory://",
    )
    engine = create_temporal_engine(
        settings, Registry([wf]), event_sink=sink, blob_store=store, heartbeat_timeout=3.0
    )
    async with engine, engine.worker():
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=60)
        history = await engine._conn.get_workflow_handle(run.id).fetch_history()
    assert store.failed == 1
    # Temporal retries the stage's activity for as long as the fault lasts, as native does
    # (20 tries, ~3 minutes of outage, charged it to the stage as a failed attempt)
    (scheduled,) = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.retry_policy.maximum_attempts == 0  # the Web UI: "Unlimited"
    assert info.status == "completed" and info.output == "onetwo"
    assert info.stage("s").attempt == 1
    assert (ran["one"], ran["two"]) == (1, 2)  # step one was journaled: replayed, not re-run
    assert [t for t, stage in trace(sink, run) if stage == "s"] == [
        "stage.started",
        "stage.completed",
    ]
