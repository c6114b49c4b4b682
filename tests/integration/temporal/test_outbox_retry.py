"""The Temporal driver applies the native outbox's rule to a failing sink: retries with
backoff, and dead letters only after N attempts spanning a minimum time (issue 11, item 7)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import BaseModel

from engine_port import Event, FolderBlobStore, MemorySink, Registry, StageContext, Workflow

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal

# dead after 2 attempts spanning 5 s; retries 50 ms apart doubling up to 200 ms
SHORT = {
    "dead_letter_after": 2,
    "outbox_dead_letter_min_seconds": 5.0,
    "outbox_retry_initial_seconds": 0.05,
    "outbox_retry_max_seconds": 0.2,
}


class In(BaseModel):
    n: int = 0


class OutageSink(MemorySink):
    """Down for ``outage`` seconds from its first delivery attempt; counts its failures."""

    def __init__(self, outage: float) -> None:
        super().__init__()
        self.outage = outage
        self.down_since: float | None = None
        self.failures = 0

    async def publish(self, events: Sequence[Event]) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.failing = time.monotonic() - self.down_since < self.outage
        self.failures += self.failing
        await super().publish(events)


async def test_an_outage_shorter_than_the_minimum_span_dead_letters_nothing(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    wf = Workflow("sink-outage", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    sink = OutageSink(2.0)
    engine = make_engine(Registry([wf]), sink=sink, **SHORT)
    async with engine, engine.worker():
        run = await engine.start("sink-outage", {})
        assert (await engine.wait(run.id, timeout=60)).status == "completed"
        deadline = time.monotonic() + 30
        while len(sink.for_run(run.id)) < 5:
            assert time.monotonic() < deadline, "events never delivered"
            await asyncio.sleep(0.02)
        flushed = await engine.flush_events()
    # as many failed attempts as dead_letter_after (the old rule's dead letter), yet nothing
    # dead-lettered: the attempts spanned less than the minimum
    assert sink.failures >= SHORT["dead_letter_after"]
    assert flushed.dead == 0
    assert await FolderBlobStore(blob_dir).list("dlq/") == []
    assert [t for t, _ in trace(sink, run)] == [
        "run.created",
        "run.started",
        "stage.started",
        "stage.completed",
        "run.completed",
    ]


async def test_wait_reports_the_end_of_a_run_while_its_events_still_retry(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    """As on the native driver, a sink outage never delays ``wait()``: the run's status is
    final as soon as it ends, while its events keep being retried: since runs end without a
    local activity (``run_end = "worker"``), by the worker that recorded the end, from the
    BlobStore where it kept them."""
    wf = Workflow("sink-down-wait", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    sink = OutageSink(3600.0)
    engine = make_engine(Registry([wf]), sink=sink, **{**SHORT, "dead_letter_after": 1000})
    async with engine, engine.worker():
        run = await engine.start("sink-down-wait", {})
        info = await engine.wait(run.id, timeout=60)
        assert info.status == "completed" and info.output == 1
        desc = await engine._conn.get_workflow_handle(run.id).describe()
        assert desc.close_time is not None  # the end is recorded: the execution closed
        kept = await FolderBlobStore(blob_dir).list(f"outbox/{run.id}/")
        assert kept, "the undelivered events are not kept"
        failed = sink.failures
        deadline = time.monotonic() + 30
        while sink.failures < failed + 2:  # still retried, after the execution closed
            assert time.monotonic() < deadline, "the worker stopped retrying the sink"
            await asyncio.sleep(0.02)
        assert sink.for_run(run.id) == []
    # the worker stopped: they stay kept for the next flush_events() of an engine with a sink
    assert await FolderBlobStore(blob_dir).list(f"outbox/{run.id}/") == kept
    sink.outage = 0
    again = make_engine(Registry([wf]), sink=sink, **SHORT)
    async with again:
        assert (await again.flush_events()).published == 5
    assert [t for t, _ in trace(sink, run)][-1] == "run.completed"
    assert await FolderBlobStore(blob_dir).list(f"outbox/{run.id}/") == []
