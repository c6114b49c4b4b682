"""DeadLetterLog: a batch of dead letters logs a handful of WARNING lines (the first few
events, then one summary), the rest at DEBUG; a sink outage with a backlog once logged a
WARNING per event (about 200 lines in 2 s, 2026-12-05)."""

from __future__ import annotations

import logging

import pytest

from engine_port.driver import DeadLetteredEvent, DeadLetterLog, log_dead_letter

LOGGER = "wfe.test.dead_letters"


def batch(n: int, run: str = "run-1", start: int = 1) -> list[DeadLetteredEvent]:
    return [
        DeadLetteredEvent(f"ev-{run}-{i}", run, i, 3, "ConnectionError: down")
        for i in range(start, start + n)
    ]


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_a_big_batch_warns_for_three_events_and_sums_up_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    DeadLetterLog(logging.getLogger(LOGGER)).log_batch(batch(200), min_seconds=300)
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 4
    for i, r in enumerate(warnings[:3], start=1):
        message = r.getMessage()
        assert f"event ev-run-1-{i} (seq {i}) of run run-1 dead-lettered" in message
        assert "after 3 failed deliveries over at least 300s" in message
        assert "ConnectionError: down" in message
        assert (r.wfe_event_id, r.wfe_event_seq, r.wfe_run_id) == (f"ev-run-1-{i}", i, "run-1")  # type: ignore[attr-defined]
    summary = warnings[3].getMessage()
    assert "197 more event(s) dead-lettered in this flush" in summary
    assert "`wfe dlq list`" in summary and "`wfe dlq replay`" in summary
    assert warnings[3].wfe_dead_lettered == 197  # type: ignore[attr-defined]
    # the rest keep their line (and fields), at DEBUG
    debug = records(caplog, logging.DEBUG)
    assert [r.wfe_event_seq for r in debug] == list(range(4, 201))  # type: ignore[attr-defined]


def test_a_small_batch_warns_for_each_event_and_needs_no_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    dead_log = DeadLetterLog(logging.getLogger(LOGGER))
    dead_log.log_batch(batch(3))
    dead_log.log_batch([])
    assert len(records(caplog, logging.WARNING)) == 3
    assert records(caplog, logging.DEBUG) == []
    assert not any("more event" in r.getMessage() for r in caplog.records)


def test_without_a_window_each_batch_has_its_own_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    dead_log = DeadLetterLog(logging.getLogger(LOGGER))
    for flush in range(3):
        dead_log.log_batch(batch(10, run=f"run-{flush}"), scope="publish batch")
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 12  # 3 events and a summary per batch
    summaries = [r.getMessage() for r in warnings if "more event" in r.getMessage()]
    assert len(summaries) == 3
    assert all("7 more event(s) dead-lettered in this publish batch" in s for s in summaries)


def test_a_window_shares_the_budget_across_small_batches_and_counts_the_quiet_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a driver that dead-letters one run's batch at a time: 200 runs of one event each
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    now = [0.0]
    dead_log = DeadLetterLog(logging.getLogger(LOGGER), window_seconds=60, clock=lambda: now[0])
    for i in range(200):
        now[0] = i * 0.01
        dead_log.log_batch(batch(1, run=f"run-{i}"), scope="batch")
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 4
    assert "1 more event(s) dead-lettered in this batch" in warnings[3].getMessage()
    assert "next 60s log at DEBUG" in warnings[3].getMessage()
    assert len(records(caplog, logging.DEBUG)) == 197
    # the next window's first batch first counts the quiet ones of the last window
    caplog.clear()
    now[0] = 100.0
    dead_log.log_batch(batch(1, run="run-later"), scope="batch")
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 2
    assert "196 more event(s) dead-lettered in the last 60s" in warnings[0].getMessage()
    assert warnings[0].wfe_dead_lettered == 196  # type: ignore[attr-defined]
    assert "ev-run-later-1" in warnings[1].getMessage()


def test_the_single_event_line_is_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    log_dead_letter(logging.getLogger(LOGGER), event_id="ev", seq=2, run_id="run", error=None)
    (r,) = caplog.records
    assert r.levelno == logging.WARNING
    assert r.getMessage() == (
        "outbox: event ev (seq 2) of run run dead-lettered after its failed deliveries "
        "spanned the dead-letter rule; last sink error: unknown. Fix the sink, then "
        "replay_dlq() re-queues it"
    )
