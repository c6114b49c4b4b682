"""A sink outage with a backlog dead-letters many events in one flush: the operator reads a
handful of WARNING lines on ``wfe.outbox`` (the first few events and one summary), not one
per event (about 200 lines in 2 s, 2026-12-05). Counters still count every dead letter."""

from __future__ import annotations

import logging

import pytest

from driver_native import process_available_jobs
from engine_port import MemorySink

from . import workflows as w
from .conftest import MakeEngine, count_rows


async def test_a_flush_that_dead_letters_a_backlog_logs_a_few_warnings_and_a_summary(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="wfe.outbox")
    sink = MemorySink()
    engine = await make_engine(
        w.linear, event_sink=sink, dead_letter_after=1, outbox_dead_letter_min_seconds=0
    )
    runs = [await engine.start("it-linear", {"n": i}) for i in range(20)]
    done = await process_available_jobs(engine.kernel, 100, flush_outbox_after_job=False)
    assert done.succeeded == 60
    total = await count_rows(engine, "wfe_outbox")
    assert total == 200  # 10 events a run
    sink.failing = True
    caplog.clear()
    result = await engine.flush_events()
    assert result.dead_lettered == total and result.failed == 0  # counted as before
    assert await count_rows(engine, "wfe_outbox", status="dead") == total

    outbox = [r for r in caplog.records if r.name == "wfe.outbox"]
    warnings = [r for r in outbox if r.levelno == logging.WARNING]
    assert len(warnings) == 4, [r.getMessage() for r in warnings]
    run_ids = {r.id for r in runs}
    for r in warnings[:3]:  # the first events, with their ids and runs as before
        assert r.wfe_run_id in run_ids  # type: ignore[attr-defined]
        assert r.wfe_event_id in r.getMessage()  # type: ignore[attr-defined]
        assert "ConnectionError: event sink unavailable" in r.getMessage()
    summary = warnings[3].getMessage()
    assert f"{total - 3} more event(s) dead-lettered in this flush" in summary
    assert "`wfe dlq list`" in summary and "`wfe dlq replay`" in summary
    # every other dead letter keeps its own line, at DEBUG
    debug = [r for r in outbox if r.levelno == logging.DEBUG and "dead-lettered" in r.getMessage()]
    assert len(debug) == total - 3
    seen = {r.wfe_event_id for r in warnings[:3] + debug}  # type: ignore[attr-defined]
    assert len(seen) == total

    # the next outage's flush has its own few warnings
    assert await engine.replay_dlq() == total
    caplog.clear()
    assert (await engine.flush_events()).dead_lettered == total
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 4
