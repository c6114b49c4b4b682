"""The port's rules for the stages an import takes in (``engine_port._imported``): which
attempt exported running at a wait is taken in suspended there, and which suspension a
stage imported suspended is known to have emitted at the source."""

from __future__ import annotations

from datetime import UTC, datetime

from engine_port import Lifecycle, RunSnapshot, RunStatus, StageStatus
from engine_port.driver import SnapshotStage, SnapshotStep, announced_suspension, at_its_wait

DEADLINE = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _wait(
    name: str = "go", *, signal: str = "go", deadline: datetime | None = None
) -> SnapshotStep:
    return SnapshotStep(name=name, kind="signal", completed=False, deadline=deadline, signal=signal)


def _stage(**fields: object) -> SnapshotStage:
    base: dict[str, object] = {
        "id": "b",
        "status": StageStatus.SUSPENDED,
        "attempt": 1,
        "suspensions": 1,
        "waiting_for": "signal:go",
        "steps": [_wait()],
    }
    return SnapshotStage.model_validate({**base, **fields})


def _snap(*stages: SnapshotStage) -> RunSnapshot:
    return RunSnapshot(
        run_id="r-1",
        workflow_id="wf",
        version="v1",
        status=RunStatus.SUSPENDED,
        input={},
        stages=list(stages),
        event_seq=7,
        redrive_count=2,
    )


def _emitted(st: SnapshotStage, step: str) -> str:
    return (
        Lifecycle("r-1", 2)
        .stage_suspended(
            st.id, st.attempt, step, st.suspensions, "signal", st.wake_at, st.waiting_for or ""
        )
        .id
    )


def test_the_suspension_of_a_signal_wait_is_the_one_the_drivers_emit() -> None:
    st = _stage(steps=[_wait("go#2", deadline=DEADLINE)], wake_at=DEADLINE)
    assert announced_suspension(_snap(st), st) == _emitted(st, "go#2")
    gate = _stage(steps=[])  # (``after_signal`` without a deadline journals nothing)
    assert announced_suspension(_snap(gate), gate) == _emitted(gate, "go")


def test_no_suspension_is_vouched_for_without_a_wait_that_matches_the_stage() -> None:
    cases = [
        _stage(status=StageStatus.RUNNING, waiting_for=None),
        _stage(suspensions=0),
        _stage(attempt=0),
        _stage(waiting_for="sleep:nap", wake_at=DEADLINE),
        _stage(steps=[_wait(deadline=DEADLINE)]),  # (its deadline is not the stage's)
        _stage(steps=[_wait(signal="other")]),
        _stage(steps=[_wait(), _wait("go#2")]),
        _stage(steps=[], wake_at=DEADLINE),
    ]
    for st in cases:
        assert announced_suspension(_snap(st), st) is None, st


def test_an_attempt_running_at_the_one_wait_it_suspended_in_is_taken_in_suspended() -> None:
    running = _stage(
        status=StageStatus.RUNNING,
        waiting_for=None,
        steps=[SnapshotStep(name="x", kind="run", completed=True), _wait(deadline=DEADLINE)],
    )
    parked = at_its_wait(running)
    assert (parked.status, parked.waiting_for, parked.wake_at) == (
        StageStatus.SUSPENDED,
        "signal:go",
        DEADLINE,
    )
    assert announced_suspension(_snap(parked), parked) == _emitted(parked, "go")
    nap = SnapshotStep(name="nap", kind="sleep", completed=True, deadline=DEADLINE)
    for unknown in (
        running.model_copy(update={"suspensions": 0}),  # (a lost try journaled the wait)
        running.model_copy(update={"steps": [nap, _wait()]}),  # (it may have slept there)
    ):
        assert at_its_wait(unknown) is unknown
