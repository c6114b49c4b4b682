"""A wait's ``wfe.take_signal`` ask that gets no answer (the RPC timed out on a busy server or
worker) is asked again with the same update id instead of suspending the stage at once; a
rejection (nothing to take) suspends at once. No server: the run's handle is a fake."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import ApplicationError

from driver_temporal._activities import DriverActivities


class _Handle:
    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = outcomes
        self.ids: list[str | None] = []

    async def execute_update(self, name: str, body: Any, **kw: Any) -> Any:
        self.ids.append(kw.get("id"))
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class _Claim:
    async def load(self, value: Any, *, run_id: str) -> Any:
        return value


async def _take(monkeypatch: pytest.MonkeyPatch, outcomes: list[Any]) -> tuple[Any, _Handle]:
    handle = _Handle(outcomes)
    client = SimpleNamespace(get_workflow_handle=lambda *a, **k: handle)
    monkeypatch.setattr(activity, "client", lambda: client)
    acts = DriverActivities.__new__(DriverActivities)
    acts.claim = _Claim()  # type: ignore[assignment]
    acts.take_timeout = 1.0
    acts.take_tries = 3
    info = SimpleNamespace(workflow_id="run-1", workflow_run_id="r1")
    task = {"stage_id": "x", "token": 7}
    got = await acts._take_signal(info, task, 0, "wait_a", "a")  # type: ignore[arg-type]
    return got, handle


async def test_take_asks_again_after_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    got, handle = await _take(
        monkeypatch,
        [WorkflowUpdateRPCTimeoutOrCancelledError(), {"taken": True, "payload": {"n": 1}}],
    )
    assert got == (True, {"n": 1})  # the wait completes with its signal: no suspension
    assert len(handle.ids) == 2 and handle.ids[0] == handle.ids[1] is not None


async def test_take_rejected_suspends_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rejected = WorkflowUpdateFailedError(ApplicationError("no signal", type="NothingToTake"))
    got, handle = await _take(monkeypatch, [rejected])
    assert got == (False, None)
    assert len(handle.ids) == 1


async def test_take_gives_up_after_its_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    got, handle = await _take(
        monkeypatch, [WorkflowUpdateRPCTimeoutOrCancelledError() for _ in range(3)]
    )
    assert got == (False, None)  # the wait suspends and resumes the usual way
    assert len(handle.ids) == 3
