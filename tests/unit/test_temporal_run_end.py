"""The worker's recording of a run's end (``driver_temporal._run_end``), called from a
workflow's thread as the run's last workflow task does: the final state is stored and the last
events delivered before the call returns; a slow or failing sink never holds the task (the
events are kept in the BlobStore and retried with the outbox's rule); a failing store raises
(the workflow task fails and Temporal retries it: nothing is lost)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pydantic_core
import pytest

from driver_temporal._activities import DriverActivities, EventStats
from driver_temporal._run_end import RunEnds
from engine_port import (
    ClaimCheck,
    Event,
    FolderBlobStore,
    MemoryBlobStore,
    MemorySink,
    Registry,
    StageRunner,
)

RULE = {"dead_after": 3, "dead_min_s": 0.0, "retry_initial_s": 0.02, "retry_max_s": 0.05}


def _events(run_id: str, seqs: Sequence[int]) -> list[dict[str, Any]]:
    return [
        Event(
            id=f"{run_id}-e{s}", run_id=run_id, seq=s, type="run.completed", workflow_id="w", at=0
        ).model_dump(mode="json")
        for s in seqs
    ]


class SlowSink(MemorySink):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def publish(self, events: Sequence[Event]) -> None:
        await asyncio.sleep(self.delay)
        await super().publish(events)


class BrokenStore(MemoryBlobStore):
    async def put(self, key: str, data: bytes) -> None:
        raise OSError("disk full")

    def put_now(self, key: str, data: bytes) -> None:
        raise OSError("disk full")


def _ends(sink: MemorySink | None, store: MemoryBlobStore) -> tuple[RunEnds, EventStats]:
    stats = EventStats()
    acts = DriverActivities(
        Registry([]), ClaimCheck(store), cast(StageRunner, None), sink, stats, 1.0
    )
    return RunEnds(acts), stats


async def _record(ends: RunEnds, run_id: str, events: list[dict[str, Any]]) -> None:
    """Call ``record`` from another thread, as a workflow task does."""
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(ends.record, loop, run_id, {"status": "completed"}, events, False, RULE)


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_the_state_is_stored_and_the_events_delivered_before_it_returns() -> None:
    store, sink = MemoryBlobStore(), MemorySink()
    ends, stats = _ends(sink, store)
    await _record(ends, "r1", _events("r1", [4, 5]))
    assert [e.seq for e in sink.events] == [4, 5]
    assert await store.get("runs/r1/state.json") == b'{"status":"completed"}'
    assert await store.list("outbox/") == []
    assert stats.delivered == 2


async def test_a_slow_sink_never_holds_the_task_its_events_are_kept_then_delivered() -> None:
    store, sink = MemoryBlobStore(), SlowSink(5.0)
    ends, _ = _ends(sink, store)
    await _record(ends, "r1", _events("r1", [1, 2, 3]))
    # returned before the sink took them (the SDK fails a task held 2 s), having kept them
    assert sink.events == []
    assert await store.list("outbox/r1/") != []
    sink.delay = 0
    await _until(lambda: len(sink.events) >= 3, "the kept events were never delivered")
    assert [e.seq for e in sink.events][-3:] == [1, 2, 3]
    await _until(lambda: not any(k.startswith("outbox/") for k in store.blobs), "still kept")
    await ends.aclose()


async def test_a_failing_sink_is_retried_then_dead_lettered_with_the_outbox_rule() -> None:
    store, sink = MemoryBlobStore(), MemorySink()
    sink.failing = True
    ends, stats = _ends(sink, store)
    await _record(ends, "r1", _events("r1", [1, 2]))
    await _until(lambda: stats.dead == 2, "never dead-lettered")
    assert sink.attempts == RULE["dead_after"]  # the end's attempt and the retries
    assert len(await store.list("dlq/r1/")) == 2
    assert await store.list("outbox/r1/") == []


async def test_a_failing_store_raises_into_the_task() -> None:
    ends, _ = _ends(MemorySink(), BrokenStore())
    with pytest.raises(OSError, match="disk full"):
        await _record(ends, "r1", _events("r1", [1]))


async def test_a_sinkless_worker_keeps_the_events() -> None:
    store = MemoryBlobStore()
    ends, _ = _ends(None, store)
    await _record(ends, "r1", _events("r1", [1, 2]))
    assert len(await store.list("outbox/r1/")) == 1  # one batch


def test_a_sinkless_worker_on_a_folder_store_records_on_the_calling_thread(
    tmp_path: Path,
) -> None:
    """No hop to the worker's event loop (here one that does not run: a hop would wait
    for it in vain): the state and the kept batch are written by the workflow's thread."""
    store = FolderBlobStore(tmp_path)
    ends, _ = _ends(None, store)
    loop = asyncio.new_event_loop()
    try:
        ends.record(loop, "r1", {"status": "completed"}, _events("r1", [1, 2]), False, RULE)
        ends.hand(loop, "r2", _events("r2", [3]), True, RULE)
    finally:
        loop.close()
    assert (tmp_path / "runs/r1/state.json").read_bytes() == b'{"status":"completed"}'
    kept = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    assert kept == [
        "outbox/r1/0000000001-to-0000000002.json",
        "outbox/r2/0000000003-to-0000000003.json",
        "runs/r1/state.json",
    ]
    batch = (tmp_path / "outbox/r1/0000000001-to-0000000002.json").read_bytes()
    assert [e["seq"] for e in pydantic_core.from_json(batch)] == [1, 2]


async def test_dead_letters_are_reported_with_the_sinks_error() -> None:
    """A ``flush_events()`` between the failure that kept a batch and its dead letters took
    the sink's error: the one that reports the dead letters says degraded all the same
    (conformance s17 saw dead letters reported with a healthy sink)."""
    store, sink = MemoryBlobStore(), MemorySink()
    ends, stats = _ends(sink, store)
    kept = pydantic_core.to_json(_events("r1", [1, 2]))
    await store.put("outbox/r1/0000000001-to-0000000002.json", kept)
    await ends._retry("r1", {**RULE, "dead_after": 1}, "ConnectionError: down")
    assert stats.dead == 2 and stats.error == "ConnectionError: down"


async def test_dead_letters_of_the_workflows_outbox_are_reported_with_the_sinks_error() -> None:
    """The same through ``wfe.publish`` and ``wfe.dead_letter`` (the run's outbox while it
    runs): a flush between the refusal and the dead letter took the error, and the flush that
    reports the dead letters said the sink was healthy (conformance s17, Temporal, once in a
    clean run)."""
    sink = MemorySink()
    sink.failing = True
    stats = EventStats()
    acts = DriverActivities(
        Registry([]), ClaimCheck(MemoryBlobStore()), cast(StageRunner, None), sink, stats, 1.0
    )
    events = _events("r1", [1, 2])
    assert not (await acts.deliver(events, False, count_failures=True))["ok"]
    error, stats.error = stats.error, None  # what flush_events() does
    assert stats.take() == (0, 2, 0) and error and "event sink unavailable" in error
    await acts.dead_letter(events)
    assert stats.take() == (0, 0, 2)
    assert stats.error == error  # reported degraded, with the sink's error


async def test_a_kept_batch_ends_in_one_place_when_a_flush_meets_its_dead_letter() -> None:
    """The retry has given a kept batch up (refused ``dead_after`` times) and is writing its
    dead letters when the sink comes back and ``flush_events()`` delivers what is kept: the
    batch is dead-lettered or delivered, never both (conformance s17 on Temporal, beside a CPU
    hog: the run's events reached the sink, were then dead-lettered, and the flush after that
    said degraded)."""
    store, sink = MemoryBlobStore(), MemorySink()
    sink.failing = True
    ends, stats = _ends(sink, store)
    acts = ends._acts
    gate, writing = asyncio.Event(), asyncio.Event()
    real = acts.dead_letter

    async def slow_dead_letter(events: list[dict[str, Any]]) -> None:
        writing.set()
        await gate.wait()
        await real(events)

    acts.dead_letter = slow_dead_letter  # type: ignore[method-assign]
    await store.put(
        "outbox/r1/0000000001-to-0000000002.json", pydantic_core.to_json(_events("r1", [1, 2]))
    )
    retry = asyncio.create_task(
        ends._retry("r1", {**RULE, "dead_after": 2}, "ConnectionError: down")
    )
    await asyncio.wait_for(writing.wait(), 10)
    sink.failing = False
    flush = asyncio.create_task(acts.deliver_parked())
    await asyncio.wait({flush}, timeout=1.0)  # (done at once when nothing keeps it waiting)
    gate.set()
    await asyncio.wait_for(asyncio.gather(retry, flush), 10)
    delivered = [e.seq for e in sink.for_run("r1")]
    dead = await store.list("dlq/r1/")
    assert len(delivered) + len(dead) == 2, (delivered, dead)
    assert stats.dead == len(dead)
