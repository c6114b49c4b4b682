"""The transactional outbox: a failing sink degrades the flush without blocking runs; events
dead-letter after N failures; replay_dlq re-queues them for delivery in per-run order."""

from __future__ import annotations

from driver_native import process_available_jobs
from engine_port import MemorySink

from . import workflows as w
from .conftest import MakeEngine, count_rows


async def test_failing_sink_degrades_but_never_blocks_runs(make_engine: MakeEngine) -> None:
    sink = MemorySink()
    sink.failing = True
    engine = await make_engine(w.linear, event_sink=sink, dead_letter_after=1000)
    run = await engine.start("it-linear", {"n": 1})
    async with engine.worker(flush_interval=0.01) as host:
        info = await engine.wait(run.id, timeout=10)
        last = host.last_flush
    assert info.status == "completed"
    assert last is not None and last.degraded
    assert sink.events == []
    result = await engine.flush_events()
    assert result.degraded and result.failed == 10 and result.delivered == 0
    sink.failing = False
    result = await engine.flush_events()
    assert not result.degraded and result.delivered == 10
    assert [e.seq for e in sink.for_run(run.id)] == list(range(1, 11))


async def test_dead_letter_and_replay_in_per_run_order(make_engine: MakeEngine) -> None:
    sink = MemorySink()
    engine = await make_engine(w.linear, event_sink=sink, dead_letter_after=3)
    runs = [await engine.start("it-linear", {"n": i}) for i in range(2)]
    outcomes = await process_available_jobs(engine.kernel, 20)
    assert [o["outcome"] for o in outcomes] == ["completed"] * 6
    total = await count_rows(engine, "wfe_outbox")
    assert total == 20
    sink.failing = True
    for attempt in (1, 2, 3):
        result = await engine.flush_events()
        assert result.degraded and result.failed == total
        assert result.dead == (total if attempt == 3 else 0)
    assert await count_rows(engine, "wfe_outbox", status="dead") == total
    assert (await engine.flush_events()).failed == 0  # dead letters are not retried
    sink.failing = False
    assert (await engine.flush_events()).delivered == 0
    assert await engine.replay_dlq() == total
    assert await count_rows(engine, "wfe_outbox", status="pending") == total
    result = await engine.flush_events()
    assert result.delivered == total and not result.degraded
    for run in runs:
        delivered = [e.seq for e in sink.events if e.run_id == run.id]
        assert delivered == list(range(1, 11))  # delivered once each, in sequence order
        assert [e.type for e in sink.for_run(run.id)][-2:] == ["it.done", "run.completed"]
    assert await count_rows(engine, "wfe_outbox", status="delivered") == total
