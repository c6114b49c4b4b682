"""Recorded histories of a parallel group with signals replay on the current workflow code.

``holder_rule_*.json`` were recorded on the code before shared signal takes (commit b537c01),
where the first attempt of the group was handed the buffered signals as their only taker: in
``buffered`` the sibling waiting for a buffered signal suspended once and resumed after that
attempt returned, in ``resume`` the sibling stayed suspended after its signal came. A worker
with the current code must replay such runs unchanged (their history lacks the
``wfe-shared-signal-takes`` patch marker, so they keep the old rule) instead of failing their
workflow tasks with a non-determinism error. ``shared_takes_buffered.json`` is the buffered
scenario on the current code (no suspension). ``publish_per_task_resume.json`` is the resume
scenario recorded on commit ec087fd, before stage activities carried the run's events and the
internal handlers were renamed ``wfe.internal.*``: every workflow task published its events with
a ``wfe.publish`` local activity, and its stage took a buffered signal with the
``wfe.take_signal`` update, which the run still answers to. ``events_via_activities_resume``
is the same scenario on the code that replaced it (stage activities carry the events, no patch
markers, ``wfe.internal.*`` names). ``after_locals_resume`` is the same scenario recorded on
commit 417fb7a, the last code whose runs wrote their ``wfe_run`` memo whenever a stage started
or completed (``memo_writes="after-locals"``; runs started since write it only when their status
changes). ``run_end_by_worker_resume`` is the same scenario on the code whose runs end without
a ``wfe.save_state`` local activity (``run_end="worker"``: the worker of the last workflow task
records the run's end, ``_run_end``). ``graph_in_input_resume`` is the same scenario on the code
whose runs carry their graph in the workflow input's metadata and write a compact ``wfe_run``
memo (``_start.CARRIED``, ``memo_shape="compact"``). ``events_handed_resume`` is the same
scenario on the code whose runs hand the events no activity carries to the worker running the
workflow task instead of a ``wfe.publish`` local activity (``publish="worker"``).
``local_chain`` is a chain of three ``local=True`` stages run as one local activity (``local:
"chains"``): the first takes a buffered signal, the second runs a journaled step and fails its
first attempt inside the chain, and its retry goes on with the third. Recorded with
``histories/record_signals.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from driver_temporal._workflow import GraphWorkflow, workflow_runner

HISTORIES = Path(__file__).parent / "histories"


@pytest.mark.parametrize(
    "name",
    [
        "holder_rule_buffered",
        "holder_rule_resume",
        "holder_rule_timeout",
        "shared_takes_buffered",
        "publish_per_task_resume",
        "events_via_activities_resume",
        "after_locals_resume",
        "run_end_by_worker_resume",
        "graph_in_input_resume",
        "events_handed_resume",
        "local_chain",
    ],
)
async def test_recorded_history_replays(name: str) -> None:
    data = json.loads((HISTORIES / f"{name}.json").read_text())
    history = WorkflowHistory.from_json(data["workflow_id"], data["history"])
    replayer = Replayer(workflows=[GraphWorkflow], workflow_runner=workflow_runner())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{name} no longer replays: {result.replay_failure!r}"
