"""Normalised traces and golden files: the observable behaviour both drivers must share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from engine_port import Event, GraphModel, RunInfo

__all__ = ["GOLDEN_DIR", "check_golden", "normalise", "run_summary"]

GOLDEN_DIR = Path(__file__).parent / "golden"

_GROUPED = {"stage.started", "stage.suspended", "stage.completed", "stage.failed"}


def _entry(e: Event, stage_names: dict[str, str]) -> list[Any]:
    d = e.data
    stage = stage_names.get(e.stage or "", e.stage)
    if e.type in ("stage.started", "stage.completed"):
        return [e.type, stage, d.get("attempt")]
    if e.type == "stage.failed":
        return [e.type, stage, d.get("attempt"), d["error"]["type"], d.get("will_retry")]
    if e.type == "stage.suspended":
        return [e.type, stage, d.get("reason"), d.get("waiting_for")]
    if e.type == "run.failed":
        return [e.type, d["error"]["type"], stage_names.get(d["error"].get("stage") or "")]
    if e.type == "run.redriven":
        return [e.type, d.get("from")]
    if e.business:
        return ["business", e.type, stage, d]
    return [e.type, stage] if stage else [e.type]


def normalise(events: list[Event], graph: GraphModel) -> list[list[Any]]:
    """Dedupe by id, order by seq, check seq has no gaps, and order each execution group's
    interleaved stage events by stage id (keeping each stage's own order). ``run.migrated``
    counts for the sequence but is left out of the trace: a moved run must read the same as
    one that never moved."""
    seen: dict[str, Event] = {}
    for e in events:
        seen.setdefault(e.id, e)
    ordered = sorted(seen.values(), key=lambda e: e.seq)
    seqs = [e.seq for e in ordered]
    if seqs != list(range(1, len(seqs) + 1)):
        raise AssertionError(f"event sequence numbers have gaps or duplicates: {seqs}")
    group_of = {sid: i for i, g in enumerate(graph.groups) for sid in g}
    out: list[list[Any]] = []
    segment: list[Event] = []
    seg_group: int | None = None

    def flush() -> None:
        segment.sort(key=lambda e: e.stage or "")  # stable: keeps each stage's own order
        out.extend(_entry(e, {}) for e in segment)
        segment.clear()

    for e in ordered:
        if e.type == "run.migrated":
            continue  # where a run lives is not part of its behaviour (checked separately)
        g = group_of.get(e.stage or "") if e.type in _GROUPED and not e.business else None
        if g is None or (seg_group is not None and g != seg_group):
            flush()
            seg_group = None
        if g is None:
            out.append(_entry(e, {}))
        else:
            segment.append(e)
            seg_group = g
    flush()
    return out


def run_summary(info: RunInfo) -> dict[str, Any]:
    return {
        "status": info.status.value,
        "stages": {s.id: s.status.value for s in info.stages},
        "error": None if info.error is None else [info.error.type, info.error.stage],
        "compensation_errors": [[e.type, e.stage] for e in info.compensation_errors],
    }


def check_golden(name: str, trace: Any) -> None:
    """Compare ``trace`` with conformance/golden/<name>.json (WFE_UPDATE_GOLDEN=1 rewrites)."""
    path = GOLDEN_DIR / f"{name}.json"
    text = json.dumps(trace, indent=1, sort_keys=True) + "\n"
    if os.environ.get("WFE_UPDATE_GOLDEN") == "1" or not path.exists():
        if os.environ.get("CI", "").lower() == "true" and not path.exists():
            raise AssertionError(
                f"golden trace {path.name} is missing; run the suite with "
                "WFE_UPDATE_GOLDEN=1 and commit it"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    expected = json.loads(path.read_text())
    if expected != json.loads(text):
        raise AssertionError(
            f"trace differs from golden {path.name} (behaviour changed? if on purpose, rerun "
            f"with WFE_UPDATE_GOLDEN=1)\nexpected: {json.dumps(expected)}\nactual:   "
            f"{json.dumps(json.loads(text))}"
        )
