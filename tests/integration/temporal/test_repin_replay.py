"""A run re-pinned in place (``driver_temporal._repin``) replays on the current code as it ran:
same commands (the activities scheduled before the re-pin name v1, those after it v2), and
the same events as the sink got (no server needed).

``histories/repin_in_place.json`` was recorded by
``test_repin_in_place.py::test_a_suspended_run_is_repinned_in_place_keeping_its_journal_and_queued_signal``
(``WFE_RECORD_REPIN=<file>``) on the code that introduced the re-pin: stage ``a`` ran on a v1
worker until it waited for ``go`` (step ``x`` journaled), ``more`` was queued for ``b``, the run
was re-pinned to v2 (its ``wfe.internal.repin`` updates and the v1 helper's and v2 workers'
tasks in the history), then ``a`` resumed and ``b`` ran on v2. The branch the re-pin takes
reads the deployment version each workflow task recorded, so the replay takes it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from driver_temporal._history_events import replay_events
from driver_temporal._workflow import GraphWorkflow, workflow_runner

from .test_upgrade_replay import _recorded_activities, _Scheduled

HISTORY = Path(__file__).parent / "histories" / "repin_in_place.json"


def _recorded() -> tuple[dict[str, Any], WorkflowHistory]:
    data = json.loads(HISTORY.read_text())
    return data, WorkflowHistory.from_json(data["workflow_id"], data["history"])


async def test_a_run_repinned_in_place_replays_and_schedules_what_it_did() -> None:
    data, history = _recorded()
    seen = _Scheduled()
    replayer = Replayer(
        workflows=[GraphWorkflow], workflow_runner=workflow_runner(), interceptors=[seen]
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, repr(result.replay_failure)
    recorded = _recorded_activities(data["history"])
    assert seen.scheduled == recorded
    versions = [
        (name, json.loads(args[0]["metadata"]["wfe"])["version"])
        for name, args in recorded
        if args and isinstance(args[0], dict) and "wfe" in args[0].get("metadata", {})
    ]
    assert versions == [("a", "v1"), ("a", "v2"), ("b", "v2")]


async def test_a_run_repinned_in_place_rebuilds_the_events_it_handed() -> None:
    """``engine.events`` (a replay of the history) gives each event with the id and data the
    sink got: run.redriven and the events after it under redrive 1."""
    data, history = _recorded()
    replayed = [e.model_dump(mode="json") for e in await replay_events([history])]
    keys = ("seq", "id", "type", "stage", "data")
    assert [{k: e[k] for k in keys} for e in replayed] == [
        {k: e[k] for k in keys} for e in data["events"]
    ]
