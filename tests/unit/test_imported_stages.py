"""The port's rules for the stages an import takes in (``engine_port._imported``): which
attempt exported running at a wait is taken in suspended there, and which suspension a
stage imported suspended is known to have emitted at the source."""

from __future__ import annotations

from datetime import UTC, datetime

from engine_port import Lifecycle, RunSnapshot, RunStatus, StageStatus
from engine_port.driver import (
    SnapshotStage,
    SnapshotStep,
    SnapshotWait,
    announced_suspension,
    at_its_wait,
    current_wait,
    wait_of_suspension,
)

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


# -- with the snapshot's ``suspended_in`` (the wait of the attempt's last emitted suspension) --

NAP = SnapshotStep(name="nap", kind="sleep", completed=True, deadline=DEADLINE)
AT_GO = SnapshotWait(step="go", waiting_for="signal:go")


def _running(**fields: object) -> SnapshotStage:
    return _stage(
        **{"status": StageStatus.RUNNING, "waiting_for": None, "suspensions": 2, **fields}
    )


def test_an_attempt_running_at_the_wait_it_last_suspended_in_is_taken_in_suspended() -> None:
    """Whatever else the journal holds (gap 1: a sleep, an earlier wait), or with nothing
    journaled (gap 2: an ``after_signal`` gate without a timeout)."""
    earlier = SnapshotStep(name="go", kind="signal", completed=True, result=1, signal="go")
    timed = SnapshotWait(step="go#2", until=DEADLINE, waiting_for="signal:go")
    cases = [
        (_running(steps=[NAP, _wait()], suspended_in=AT_GO), AT_GO),
        (_running(steps=[earlier, _wait("go#2", deadline=DEADLINE)], suspended_in=timed), timed),
        (_running(steps=[], suspended_in=AT_GO), AT_GO),  # (the gate)
    ]
    for running, wait in cases:
        parked = at_its_wait(running)
        assert (parked.status, parked.waiting_for, parked.wake_at, parked.suspended_in) == (
            StageStatus.SUSPENDED,
            "signal:go",
            wait.until,
            wait,
        ), running
        assert announced_suspension(_snap(parked), parked) == _emitted(parked, wait.step)


def test_an_attempt_whose_last_suspension_was_elsewhere_stays_running() -> None:
    in_the_nap = SnapshotWait(step="nap", until=DEADLINE, waiting_for="sleep:nap")
    done = SnapshotStep(name="go", kind="signal", completed=True, result=1, signal="go")
    cases = [
        _running(steps=[NAP, _wait()], suspended_in=in_the_nap),  # (a lost try: the wait)
        _running(steps=[done], suspended_in=AT_GO),  # (it took its signal since)
        _running(steps=[_wait(deadline=DEADLINE)], suspended_in=AT_GO),  # (another deadline)
        _running(steps=[done, _wait("go#2")], suspended_in=AT_GO),  # (past the gate: a wait)
        _running(steps=[_wait()], suspended_in=AT_GO, suspensions=0),
    ]
    for running in cases:
        assert at_its_wait(running) is running, running


def test_a_snapshot_that_says_where_the_stage_suspended_is_believed_over_the_journal() -> None:
    """A stage suspended in a wait whose suspension the source did not emit (its last one
    was elsewhere): no id is vouched for, the target emits it."""
    st = _stage(steps=[NAP, _wait()], suspended_in=AT_GO)
    assert announced_suspension(_snap(st), st) == _emitted(st, "go")
    other = SnapshotWait(step="nap", until=DEADLINE, waiting_for="sleep:nap")
    elsewhere = st.model_copy(update={"suspended_in": other})
    assert announced_suspension(_snap(elsewhere), elsewhere) is None


def test_an_older_snapshot_without_suspended_in_still_loads() -> None:
    data = _snap(_stage()).model_dump(mode="json")
    del data["stages"][0]["suspended_in"]
    (st,) = RunSnapshot.model_validate(data).stages
    assert st.suspended_in is None and st == _stage()


def test_the_wait_of_an_emitted_suspension_is_found_by_its_id() -> None:
    st = _running(steps=[NAP, _wait("go#2", deadline=DEADLINE)])
    emitted = (
        Lifecycle("r-1", 2).stage_suspended("b", 1, "go#2", 2, "signal", DEADLINE, "signal:go").id
    )
    found = wait_of_suspension(
        "r-1", 2, st, emitted, until=DEADLINE, waiting_for="signal:go", gate=None
    )
    assert found == SnapshotWait(step="go#2", until=DEADLINE, waiting_for="signal:go")
    # the gate, found from the stage's after_signal when the stage no longer waits
    gate = _running(steps=[])
    at_gate = Lifecycle("r-1", 2).stage_suspended("b", 1, "go", 2, "signal", None, "").id
    assert wait_of_suspension("r-1", 2, gate, at_gate, until=None, waiting_for=None) is None
    assert wait_of_suspension(
        "r-1", 2, gate, at_gate, until=None, waiting_for=None, gate="go"
    ) == SnapshotWait(step="go", waiting_for="signal:go")
    # another attempt's suspension, or one numbered (a Temporal run started before)
    again = st.model_copy(update={"attempt": 2})
    numbered = Lifecycle("r-1", 2).stage_suspended("b", 1, None, 2, "signal", None, "").id
    for stage, event in ((again, emitted), (st, numbered)):
        assert (
            wait_of_suspension(
                "r-1", 2, stage, event, until=DEADLINE, waiting_for="signal:go", gate="go"
            )
            is None
        )


def test_the_wait_a_suspended_stage_is_in_is_read_from_its_journal() -> None:
    assert current_wait(_stage()) == AT_GO
    assert current_wait(_stage(steps=[])) == AT_GO  # (the gate)
    timed = _stage(steps=[NAP, _wait("go#2", deadline=DEADLINE)], wake_at=DEADLINE)
    assert current_wait(timed) == SnapshotWait(step="go#2", until=DEADLINE, waiting_for="signal:go")
    napping = _stage(
        waiting_for="sleep:nap",
        wake_at=DEADLINE,
        steps=[NAP.model_copy(update={"completed": False})],
    )
    assert current_wait(napping) == SnapshotWait(
        step="nap", until=DEADLINE, waiting_for="sleep:nap"
    )
    for unknown in (
        _stage(status=StageStatus.RUNNING),
        _stage(steps=[_wait(), _wait("go#2")]),
        _stage(steps=[], wake_at=DEADLINE),
        _stage(waiting_for="sleep:nap", steps=[]),
    ):
        assert current_wait(unknown) is None, unknown
