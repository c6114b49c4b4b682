"""RunSnapshot: the signal queue form, and snapshots written before signals queued."""

from __future__ import annotations

from typing import Any

from engine_port import RunSnapshot


def _snapshot(**extra: Any) -> dict[str, Any]:
    return {
        "run_id": "r1",
        "workflow_id": "wf",
        "version": "v1",
        "status": "suspended",
        "input": {},
        "stages": [],
        **extra,
    }


def test_buffered_signals_are_an_ordered_list_with_the_keys_seen() -> None:
    snap = RunSnapshot.model_validate(
        _snapshot(
            signals=[
                {"name": "go", "payload": {"n": 1}, "idempotency_key": "k1"},
                {"name": "go", "payload": {"n": 2}},
            ],
            signal_keys=["k0", "k1"],
        )
    )
    assert [(s.name, s.payload, s.idempotency_key) for s in snap.signals] == [
        ("go", {"n": 1}, "k1"),
        ("go", {"n": 2}, None),
    ]
    assert snap.signal_keys == ["k0", "k1"]
    again = RunSnapshot.model_validate_json(snap.model_dump_json())
    assert again == snap


def test_an_older_snapshot_with_one_signal_per_name_still_imports() -> None:
    snap = RunSnapshot.model_validate(
        _snapshot(signals={"go": {"n": 1}, "other": None}, consumed_signals=["approval"])
    )
    assert [(s.name, s.payload, s.idempotency_key) for s in snap.signals] == [
        ("go", {"n": 1}, None),
        ("other", None, None),
    ]
    assert snap.signal_keys == []
    assert "consumed_signals" not in snap.model_dump()
