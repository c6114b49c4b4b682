"""The run's start document is one typed model (issue 17: "a 17-key start payload built three
times, read with .get() defaults"): built by ``StartDocument.for_engine`` for a start, a
redrive and an import, and read by the workflow, older shapes included (no server needed)."""

from __future__ import annotations

from driver_temporal._start import StartDocument
from driver_temporal._wire import OLD_OUTBOX_RULE
from engine_port import EngineSettings

_BASE = {"run_id": "r1", "workflow_id": "w", "version": "v1", "graph": {"id": "w"}}


def test_a_document_of_a_run_started_before_reads_as_that_code_ran_it() -> None:
    # no sink retry rule, no driver marks, signals in the one-per-name form
    doc = StartDocument.model_validate({**_BASE, "input": {"x": 1}, "signals": {"go": 1}})
    assert doc.dead_letter_after == OLD_OUTBOX_RULE["dead_letter_after"]
    assert doc.dead_letter_min_seconds == OLD_OUTBOX_RULE["dead_letter_min_seconds"]
    assert doc.outbox_retry_initial_seconds == OLD_OUTBOX_RULE["outbox_retry_initial_seconds"]
    assert doc.outbox_retry_max_seconds == OLD_OUTBOX_RULE["outbox_retry_max_seconds"]
    assert not doc.events_via_activities and not doc.marked and not doc.memo_after_locals
    assert not doc.memo_on_change  # its memo: every stage that starts or completes
    assert not doc.stage_attribute_waits  # WfeStage: the stages running or suspended
    assert not doc.parks_when_slow  # a sinkless worker parks each carried batch at once
    assert not doc.ends_on_worker  # its end: the wfe.save_state local activity
    assert (doc.redrive, doc.event_seq, doc.stages, doc.imported) == (0, 0, {}, False)
    assert doc.heartbeat_timeout_s == 10.0
    assert doc.signals == {"go": 1}


def test_a_new_document_carries_the_engines_settings_and_marks() -> None:
    settings = EngineSettings(
        driver="temporal", dead_letter_after=7, max_pending_signals=3, default_stage_timeout=9
    )
    doc = StartDocument.for_engine(settings, 2.5, **_BASE, input=[1, 2], idempotency_key="k")
    assert doc.events_via_activities and doc.marked and doc.memo_after_locals
    assert doc.memo_on_change  # its memo: when its status changes (get_run asks it between)
    assert doc.stage_attribute_waits  # WfeStage: the stages waiting or failed
    assert doc.parks_when_slow  # a fast stage hands its carried batch back unparked
    assert doc.ends_on_worker  # its end: recorded by its last task's worker, no local activity
    assert (doc.dead_letter_after, doc.max_pending_signals, doc.default_stage_timeout_s) == (
        7,
        3,
        9,
    )
    assert doc.heartbeat_timeout_s == 2.5
    memo = doc.memo()
    assert "input" not in memo  # the input is the workflow's input, not the memo's
    # the graph rides in the input's metadata: the memo is written again at every change
    assert "graph" not in memo and doc.carried()["graph"] == _BASE["graph"]
    # the workflow reads it back from the memo, its input and the input's metadata
    assert StartDocument.model_validate({**memo, **doc.carried(), "input": [1, 2]}) == doc
