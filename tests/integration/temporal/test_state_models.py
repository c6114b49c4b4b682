"""The typed run state (issue 17: ``_state.StageState``, ``_state.RunMemo``) reads every
shape older code wrote and writes back the very same JSON, so running workflows replay
identically and engines read their memos unchanged (no server needed).

The recorded histories (``histories/*.json``, see ``test_signal_replay``) hold the ``wfe_run``
memos the workflow code of their time wrote, once per activation: replaying them on the
current code must write the same memos, and each must round-trip through ``RunMemo``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from driver_temporal._engine import _redriven_stages
from driver_temporal._moving import _imported_stages, _initial_memo
from driver_temporal._start import StartDocument
from driver_temporal._state import RunMemo, StageState
from driver_temporal._workflow import GraphWorkflow, workflow_runner
from engine_port import GraphModel, RunSnapshot, StageContext, Workflow

HISTORIES = Path(__file__).parent / "histories"
NAMES = sorted(p.stem for p in HISTORIES.glob("*.json"))


def _recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HISTORIES / f"{name}.json").read_text())
    return data


def _memos(name: str, key: str) -> Iterator[tuple[str, Any]]:
    """The ``key`` memo entries of a recorded history: (event type, decoded JSON)."""
    for ev in _recorded(name)["history"]["events"]:
        for attr, value in ev.items():
            if not attr.endswith("Attributes") or not isinstance(value, dict):
                continue
            fields = (value.get("memo") or value.get("upsertedMemo") or {}).get("fields", {})
            if key in fields:
                yield ev["eventType"], json.loads(base64.b64decode(fields[key]["data"]))


def _start_document(name: str) -> dict[str, Any]:
    """The start document of a recorded run: its ``wfe_start`` memo with (runs started since
    2026-12-03) the graph and stages its input's metadata carries, or (older runs) its
    workflow input."""
    for _, memo in _memos(name, "wfe_start"):
        carried: dict[str, Any] = {}
        for ev in _recorded(name)["history"]["events"]:
            attrs = ev.get("workflowExecutionStartedEventAttributes")
            meta = attrs["input"]["payloads"][0]["metadata"] if attrs else {}
            if "wfe" in meta:
                carried = json.loads(base64.b64decode(meta["wfe"]))
        return {**memo, **carried}
    for ev in _recorded(name)["history"]["events"]:
        attrs = ev.get("workflowExecutionStartedEventAttributes")
        if attrs:
            doc: dict[str, Any] = json.loads(
                base64.b64decode(attrs["input"]["payloads"][0]["data"])
            )
            return doc
    raise AssertionError(f"{name}: no start event")


@pytest.mark.parametrize("name", NAMES)
def test_every_recorded_memo_round_trips(name: str) -> None:
    memos = [memo for _, memo in _memos(name, "wfe_run")]
    assert len(memos) >= 3  # the engine's first one and the workflow's (a run in one local
    # chain writes three: at the start, after its first task, at its end)
    for memo in memos:
        assert RunMemo.model_validate(memo).to_json() == memo
    doc = _start_document(name)
    assert StartDocument.model_validate(doc).model_dump(mode="json", include=set(doc)) == doc


@pytest.mark.parametrize("name", NAMES)
async def test_replay_writes_the_memos_the_recorded_code_wrote(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[Any] = []
    upsert = workflow.upsert_memo

    def recording(updated: Any) -> None:
        written.append(json.loads(json.dumps(updated["wfe_run"])))
        upsert(updated)

    monkeypatch.setattr(workflow, "upsert_memo", recording)
    data = _recorded(name)
    history = WorkflowHistory.from_json(data["workflow_id"], data["history"])
    replayer = Replayer(workflows=[GraphWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None
    recorded = [m for ev, m in _memos(name, "wfe_run") if ev.endswith("PROPERTIES_MODIFIED")]
    assert written == recorded


# -- the shapes engines write (start, redrive, import) and the workflow saves -------------------
_SAVED_STAGE = {  # a stage of the final state ``wfe.save_state`` stores (every key)
    "id": "a",
    "status": "completed",
    "attempt": 2,
    "output": {"v": 1},
    "error": None,
    "compensation_error": None,
    "waiting_for": None,
    "wake_at": None,
    "started_at": "2026-12-01T10:00:00+00:00",
    "finished_at": "2026-12-01T10:00:01+00:00",
    "order": 1,
    "steps": {"s": {"name": "s", "kind": "run", "completed": True, "result": 3}},
    "comp_steps": {},
    "events": [{"type": "t", "data": {}}],
    "suspensions": 1,
    "backoff": False,
}
_SHAPES = [
    _SAVED_STAGE,
    {"status": "pending", "attempt": 0, "steps": {}},  # a stage a redrive re-runs
    {"status": "completed"},  # a redriven stage the run had no record of
    {  # a stage rebuilt from a memo (``_helpers._state_from_memo``), with an extra key
        "id": "b",
        "status": "suspended",
        "attempt": 1,
        "output": None,
        "waiting_for": "signal:go",
        "wake_at": None,
        "order": None,
        "steps": {},
        "events": [],
        "later_key": 1,
    },
]


@pytest.mark.parametrize("shape", _SHAPES)
def test_a_stage_record_round_trips(shape: dict[str, Any]) -> None:
    assert StageState.model_validate(shape).to_json() == shape
    doc = StartDocument(run_id="r", workflow_id="w", version="v", graph={}, stages={"a": shape})
    assert doc.carried()["stages"] == {"a": shape}  # never with defaults filled in or dropped


def _old_setup(sid: str, st: dict[str, Any]) -> dict[str, Any]:
    """The workflow's stage state as the code before the model built it (``_setup``)."""
    return {
        "id": sid,
        "status": st.get("status", "pending"),
        "attempt": st.get("attempt", 0),
        "output": st.get("output"),
        "error": st.get("error"),
        "compensation_error": None,
        "waiting_for": st.get("waiting_for"),
        "wake_at": st.get("wake_at"),
        "started_at": st.get("started_at"),
        "finished_at": st.get("finished_at"),
        "order": st.get("order"),
        "steps": dict(st.get("steps") or {}),
        "comp_steps": {},
        "events": list(st.get("events") or []),
        "suspensions": st.get("suspensions", 0),
        "backoff": False,
    }


@pytest.mark.parametrize("shape", [*_SHAPES, {}, {"status": "completed", "steps": None}])
def test_the_workflow_reads_a_stage_as_the_old_code_did(shape: dict[str, Any]) -> None:
    prior = StageState.model_validate(shape) if shape else None
    state = StageState.fresh("a", prior).to_json()
    assert state == _old_setup("a", shape)
    assert list(state) == list(_old_setup("a", shape))  # the saved state's key order too


class _In(BaseModel):
    n: int = 0


def _graph() -> GraphModel:
    wf = Workflow("w", input=_In, version="v")

    @wf.stage()
    async def a(ctx: StageContext[_In]) -> int:
        return 1

    @wf.stage(after=[a])
    async def b(ctx: StageContext[_In]) -> int:
        return 2

    return wf.graph()


def test_a_redrive_builds_the_stages_the_old_code_built() -> None:
    graph = _graph()
    failed = {**_SAVED_STAGE, "id": "b", "status": "failed", "order": None}
    saved = {"a": _SAVED_STAGE, "b": failed}
    state: dict[str, Any] = {"redrive": 1, "stages": saved}
    stages = {sid: StageState.model_validate(st) for sid, st in saved.items()}
    history: list[dict[str, Any]] = []
    new = _redriven_stages(state, stages, graph, {"b"}, "last_failure", history)
    assert {sid: st.to_json() for sid, st in new.items()} == {
        "a": {**_SAVED_STAGE, "status": "completed"},
        "b": {"status": "pending", "attempt": 0, "steps": failed["steps"]},
    }
    record = {k: v for k, v in failed.items() if k != "steps"}
    assert history == [{"redrive": 1, "stage": "b", "record": record}]


def test_an_import_writes_the_stages_and_memo_the_old_code_wrote() -> None:
    graph = _graph()
    snapshot = RunSnapshot.model_validate(
        {
            "run_id": "r",
            "workflow_id": "w",
            "version": "v",
            "status": "suspended",
            "input": {"n": 1},
            "stages": [
                {"id": "a", "status": "completed", "attempt": 1, "output": 5, "has_output": True},
                {"id": "b", "status": "suspended", "attempt": 1, "waiting_for": "signal:go"},
            ],
        }
    )
    stages = _imported_stages(snapshot)
    assert stages["b"].to_json() == {
        "status": "suspended",
        "attempt": 1,
        "output": None,
        "error": None,
        "waiting_for": "signal:go",
        "wake_at": None,
        "started_at": None,
        "finished_at": None,
        "order": None,
        "suspensions": 0,
        "steps": {},
        "events": [],
    }
    memo = _initial_memo(snapshot, graph, stages, created="c", status="suspended")
    assert memo == {
        "id": "r",
        "workflow_id": "w",
        "version": "v",
        "status": "suspended",
        "input": {"n": 1},
        "stages": [
            {
                "id": "a",
                "status": "completed",
                "attempt": 1,
                "output": 5,
                "waiting_for": None,
                "wake_at": None,
            },
            {
                "id": "b",
                "status": "suspended",
                "attempt": 1,
                "output": None,
                "waiting_for": "signal:go",
                "wake_at": None,
            },
        ],
        "idempotency_key": None,
        "redrive_count": 0,
        "created_at": "c",
        "sinks": ["b"],
        "event_seq": 0,
        "run_started": True,
    }
    assert RunMemo.model_validate(memo).to_json() == memo
