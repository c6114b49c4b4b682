"""What the pages show, computed from port models: the graph's layout, the attempt timeline,
what a run waits for, and JSON previews."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine_port import Event, GraphModel, Registry, RunInfo, StageInfo

__all__ = [
    "Box",
    "Edge",
    "GraphLayout",
    "TimelineEntry",
    "Waiting",
    "graph_for",
    "layout",
    "preview",
    "timeline",
    "waiting",
]

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 170, 48, 56, 14, 10
PREVIEW_CHARS = 2000


@dataclass(frozen=True)
class Box:
    stage: str
    status: str
    attempt: int
    x: int
    y: int
    label: str


@dataclass(frozen=True)
class Edge:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class GraphLayout:
    boxes: list[Box]
    edges: list[Edge]
    width: int
    height: int
    groups_known: bool
    columns: list[list[str]] = field(default_factory=list)

    @property
    def box_w(self) -> int:
        return BOX_W

    @property
    def box_h(self) -> int:
        return BOX_H


def graph_for(registry: Registry | None, info: RunInfo) -> GraphModel | None:
    """The run's definition from the registry the view was started with (``--app``): its own
    version, else the workflow's latest one when it has the same stages."""
    if registry is None or not registry.has(info.workflow_id):
        return None
    if registry.has(info.workflow_id, info.version):
        return registry.graph(info.workflow_id, info.version)
    latest = registry.graph(info.workflow_id)
    if {s.id for s in latest.stages} == {s.id for s in info.stages}:
        return latest
    return None


def layout(info: RunInfo, graph: GraphModel | None) -> GraphLayout:
    """Execution groups as columns (left to right), each stage a box; dependencies as edges.
    Without the definition every stage gets its own column, in the order the driver gave."""
    by_id = {s.id: s for s in info.stages}
    if graph is not None:
        columns = [[s for s in g if s in by_id] for g in graph.groups]
        placed = {s for c in columns for s in c}
        columns += [[s.id] for s in info.stages if s.id not in placed]
    else:
        columns = [[s.id] for s in info.stages]
    columns = [c for c in columns if c]
    pos: dict[str, tuple[int, int]] = {}
    boxes: list[Box] = []
    for ci, column in enumerate(columns):
        for ri, sid in enumerate(column):
            x, y = PAD + ci * (BOX_W + GAP_X), PAD + ri * (BOX_H + GAP_Y)
            pos[sid] = (x, y)
            stage = by_id[sid]
            label = sid if len(sid) <= 22 else sid[:21] + "…"
            boxes.append(Box(sid, stage.status.value, stage.attempt, x, y, label))
    edges: list[Edge] = []
    if graph is not None:
        for spec in graph.stages:
            if spec.id not in pos:
                continue
            x2, y2 = pos[spec.id]
            for dep in spec.after:
                if dep in pos:
                    x1, y1 = pos[dep]
                    edges.append(Edge(x1 + BOX_W, y1 + BOX_H // 2, x2, y2 + BOX_H // 2))
    rows = max((len(c) for c in columns), default=1)
    width = PAD * 2 + len(columns) * BOX_W + max(len(columns) - 1, 0) * GAP_X
    height = PAD * 2 + rows * BOX_H + (rows - 1) * GAP_Y
    return GraphLayout(boxes, edges, width, height, graph is not None, columns)


@dataclass(frozen=True)
class TimelineEntry:
    at: datetime | None
    stage: str | None
    what: str
    detail: str


_TIMELINE_TYPES = {
    "run.created": "created",
    "run.started": "started",
    "stage.started": "start",
    "stage.suspended": "suspend",
    "stage.resumed": "resume",
    "stage.completed": "complete",
    "stage.failed": "fail",
    "stage.cancelled": "cancel",
    "stage.compensated": "compensation",
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.redriven": "redriven",
    "run.migrated": "migrated",
}


def _detail(data: dict[str, Any]) -> str:
    parts = []
    for key in ("attempt", "waiting_for", "wake_at", "error", "will_retry", "from"):
        if key in data and data[key] is not None:
            value = data[key]
            if isinstance(value, dict):
                value = ": ".join(str(value.get(k, "")) for k in ("type", "message") if k in value)
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def timeline(info: RunInfo, events: list[Event] | None) -> list[TimelineEntry]:
    """Attempts and their moves from the event stream when the driver gives it; else from
    each stage's start and finish times."""
    if events is not None:
        out = []
        for e in events:
            if e.business:
                continue
            what = _TIMELINE_TYPES.get(e.type, e.type)
            out.append(TimelineEntry(e.at, e.stage, what, _detail(e.data)))
        return out
    entries: list[TimelineEntry] = []
    if info.created_at:
        entries.append(TimelineEntry(info.created_at, None, "created", ""))
    for s in info.stages:
        if s.started_at:
            entries.append(TimelineEntry(s.started_at, s.id, "start", f"attempt {s.attempt}"))
        if s.finished_at:
            entries.append(TimelineEntry(s.finished_at, s.id, s.status.value, ""))
    if info.finished_at:
        entries.append(TimelineEntry(info.finished_at, None, info.status.value, ""))
    return sorted(entries, key=lambda e: (e.at is None, e.at))


@dataclass(frozen=True)
class Waiting:
    stage: str
    kind: str
    name: str
    until: datetime | None


def waiting(stages: list[StageInfo]) -> list[Waiting]:
    """What the run waits for: ``signal:NAME``, ``sleep:NAME`` or ``poll:NAME`` per stage."""
    out = []
    for s in stages:
        if s.waiting_for:
            kind, _, name = s.waiting_for.partition(":")
            out.append(Waiting(s.id, kind if name else "wait", name or kind, s.wake_at))
    return out


def preview(value: Any) -> tuple[str, bool]:
    """Pretty JSON cut at PREVIEW_CHARS; True when cut (the full value is one click away)."""
    text = json.dumps(value, indent=2, default=str, ensure_ascii=False)
    if len(text) > PREVIEW_CHARS:
        return text[:PREVIEW_CHARS], True
    return text, False
