"""Runs started before the 2026-12-06 changes to the workflow code replay on the current code as
they ran: same commands, and the same events (ids, sequence numbers, data) as their code handed
the sink (no server needed).

``upgrade_*.json`` were recorded with ``histories/record_upgrade.py`` on commit 85fc7c9 (the
code before that day's changes; each file also holds the events the sink got):

- ``upgrade_gap_repeat``: the second execution of a run that continued as new, whose first task
  handled the signals sent in the gap, among them a second arrival of a send (its delivery id)
  the first execution had queued and a stage had taken. The code of that time queued it again
  (a stage took it twice); since ``SignalHandlers._early`` an execution continued with
  ``StartDocument.due_at_once`` drops it, one continued before queues it, as it did.
- ``upgrade_held_sleep``: the first execution of a young run that continued as new while its
  stage slept 2 s. Since 17d6c76 a run holds its continue while such a wait is due within
  ~2.5 s (``GraphWorkflow._due_before_next``); a run started before
  (``StartDocument.continue_hold`` absent) continues where it did.
- ``upgrade_suspends``: a stage that starts on a signal (suspended by the workflow,
  ``_gated``) and one that suspends twice, with values whose keys are not sorted. Since
  abc9a7d a ``stage.suspended`` id names the wait's step and deadline; a run started before
  (``StartDocument.suspension_ids`` absent) keeps numbering them per attempt, as it did, so
  the events it delivered keep their ids.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.common import RawValue
from temporalio.worker import (
    Interceptor,
    Replayer,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from driver_temporal._history_events import replay_events
from driver_temporal._workflow import GraphWorkflow, workflow_runner

HISTORIES = Path(__file__).parent / "histories"
NAMES = ["upgrade_gap_repeat", "upgrade_held_sleep", "upgrade_suspends"]


def _recorded(name: str) -> tuple[WorkflowHistory, list[dict[str, Any]]]:
    data = json.loads((HISTORIES / f"{name}.json").read_text())
    return WorkflowHistory.from_json(data["workflow_id"], data["history"]), data["events"]


@pytest.mark.parametrize("name", NAMES)
async def test_a_run_of_the_code_before_replays(name: str) -> None:
    history, _ = _recorded(name)
    replayer = Replayer(workflows=[GraphWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{name} no longer replays: {result.replay_failure!r}"


@pytest.mark.parametrize("name", NAMES)
async def test_a_run_of_the_code_before_rebuilds_the_events_it_handed(name: str) -> None:
    """``engine.events`` (a replay of the history) gives each event of the execution with the
    id and data the sink got from the code that ran it."""
    history, handed = _recorded(name)
    by_seq = {e["seq"]: e for e in handed}
    replayed = [e.model_dump(mode="json") for e in await replay_events([history])]
    assert replayed, name
    for event in replayed:
        sent = by_seq.get(event["seq"])
        assert sent is not None, f"{name}: event {event['seq']} was never handed"
        keys = ("id", "type", "stage", "data")
        assert {k: event[k] for k in keys} == {k: sent[k] for k in keys}, event["seq"]


class _Scheduled(Interceptor):
    """Keeps the type and arguments (as plain JSON) of every activity the replayed workflow
    schedules."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[str, list[Any]]] = []

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        scheduled = self.scheduled

        class Outbound(WorkflowOutboundInterceptor):
            def start_activity(self, input: StartActivityInput) -> Any:
                scheduled.append((input.activity, [_plain(a) for a in input.args]))
                return super().start_activity(input)

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(Outbound(outbound))

        return Inbound


def _plain(arg: Any) -> Any:
    if isinstance(arg, RawValue):  # (a payload with metadata: events carried, ``_carry``)
        meta = {k: v.decode() for k, v in arg.payload.metadata.items()}
        return {"data": json.loads(arg.payload.data), "metadata": meta}
    return json.loads(json.dumps(arg))


def _recorded_activities(history: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    found = []
    for ev in history["events"]:
        attrs = ev.get("activityTaskScheduledEventAttributes")
        if attrs is None:
            continue
        args = []
        for p in attrs.get("input", {}).get("payloads", []):
            data = json.loads(base64.b64decode(p["data"]))
            meta = {k: base64.b64decode(v).decode() for k, v in p["metadata"].items()}
            args.append({"data": data, "metadata": meta} if "wfe" in meta else data)
        found.append((attrs["activityType"]["name"], args))
    return found


@pytest.mark.parametrize("name", NAMES)
async def test_a_run_of_the_code_before_schedules_what_it_did(name: str) -> None:
    """The replay schedules each activity with the arguments the recorded run gave it (which
    Temporal's own check ignores: a stage lent another signal than the one it took replayed
    without an error, and went on from a different queue)."""
    data = json.loads((HISTORIES / f"{name}.json").read_text())
    history = WorkflowHistory.from_json(data["workflow_id"], data["history"])
    seen = _Scheduled()
    replayer = Replayer(
        workflows=[GraphWorkflow], workflow_runner=workflow_runner(), interceptors=[seen]
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{name} no longer replays: {result.replay_failure!r}"
    assert seen.scheduled == _recorded_activities(data["history"])
