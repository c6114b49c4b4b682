"""How an import takes in a snapshot's stages: rules both drivers share, so that a run moved
to either of them emits no ``stage.suspended`` id the source emitted already (DESIGN §5:
every event id is emitted once, with one sequence number)."""

from __future__ import annotations

from ._lifecycle import Lifecycle
from ._models import RunSnapshot, SnapshotStage, StageStatus

__all__ = ["announced_suspension", "at_its_wait"]


def at_its_wait(st: SnapshotStage) -> SnapshotStage:
    """``st`` as a stage suspended in its signal wait when its attempt is imported
    ``running`` at a wait it is known to have suspended in already (``stage.suspended``
    emitted at the source), else ``st`` itself. Such an attempt is one a signal had resumed
    when a freeze withdrew it, the signal given back to the queue; after an aborted export
    the signal may resume a second waiter of the name, and the move exports both running at
    their wait with one signal queued. Both ran again at the target: the one that lost the
    signal suspended again in its wait and emitted that suspension's id (the id names the
    step and its deadline) a second time, under a new sequence number. Imported suspended,
    each takes a queued signal of the name (the native driver: oldest job first; Temporal:
    the workflow lends it to one waiter) or waits for one, as a stage that suspended there.

    Known only when the attempt suspended (``suspensions``) and its journal holds no other
    step it could have suspended in (a sleep, a poll, another signal wait): every
    suspension of the attempt was in this wait. An attempt at a wait it never suspended in
    (a lost worker's try that journaled the wait before its suspension was recorded, a new
    attempt replaying the wait an earlier one journaled), or one that may have suspended in
    another wait since, stays ``running``: its suspension may not have been emitted, and
    the target emits it when the attempt suspends."""
    if st.status != StageStatus.RUNNING or st.attempt <= 0 or st.suspensions <= 0:
        return st
    waits = [step for step in st.steps if step.kind != "run"]
    if len(waits) != 1:
        return st
    (wait,) = waits
    if wait.kind != "signal" or wait.completed or not wait.signal:
        return st
    return st.model_copy(
        update={
            "status": StageStatus.SUSPENDED,
            "waiting_for": f"signal:{wait.signal}",
            "wake_at": wait.deadline,
        }
    )


def announced_suspension(snap: RunSnapshot, st: SnapshotStage) -> str | None:
    """The id of the ``stage.suspended`` the source emitted for ``st``, a stage imported
    suspended in a signal wait (after :func:`at_its_wait`), computed as the drivers compute
    it (the stage, its attempt, the wait's step and its deadline); None for any other stage,
    or when the snapshot does not say which step it waits in.

    A target that wakes every stage waiting for a name for one signal (the native driver)
    has the ones that lost it suspend again in the very same wait, with the same id: one
    emitted at the source, which the target's own outbox does not hold. The target keeps
    this id with the stage and does not emit it again.

    The step is the stage's one uncompleted signal wait of the name, its deadline the
    stage's ``wake_at``; with none journaled, the wait of ``after_signal=name`` that keeps
    no deadline (it journals nothing while it waits), whose step is the name. (A Temporal
    run started before 2026-12-06 numbered its suspensions instead: its id differs, and the
    target emits the step's id once, as it did.)"""
    if st.status != StageStatus.SUSPENDED or st.attempt <= 0 or st.suspensions <= 0:
        return None
    waiting_for = st.waiting_for or ""
    reason, _, name = waiting_for.partition(":")
    if reason != "signal" or not name:
        return None
    open_waits = [s for s in st.steps if s.kind == "signal" and not s.completed]
    if len(open_waits) > 1:
        return None
    if open_waits:
        (wait,) = open_waits
        if wait.signal != name or wait.deadline != st.wake_at:
            return None
        step = wait.name
    elif st.wake_at is None:
        step = name  # (the gate of ``after_signal``: ``Steps._gate``)
    else:
        return None
    draft = Lifecycle(snap.run_id, snap.redrive_count).stage_suspended(
        st.id, st.attempt, step, st.suspensions, "signal", st.wake_at, waiting_for
    )
    return draft.id
