"""How an import takes in a snapshot's stages: rules both drivers share, so that a run moved
to either of them emits no ``stage.suspended`` id the source emitted already (DESIGN §5:
every event id is emitted once, with one sequence number)."""

from __future__ import annotations

from ._lifecycle import Lifecycle
from ._models import RunSnapshot, SnapshotStage, SnapshotWait, StageStatus
from ._suspended_in import current_wait

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

    Known from the snapshot's ``suspended_in`` (the wait of the attempt's last emitted
    suspension): a signal wait still open, the journal's uncompleted wait of that step and
    deadline, or an ``after_signal`` gate, which journals nothing while it waits without a
    timeout. A snapshot that does not say (written before ``suspended_in``): only when the
    attempt suspended (``suspensions``) and its journal holds no other step it could have
    suspended in (a sleep, a poll, another signal wait), so that every suspension of the
    attempt was in this wait. An attempt at a wait it never suspended in (a lost worker's
    try that journaled the wait before its suspension was recorded, a new attempt replaying
    the wait an earlier one journaled), or one that suspended in another wait since, stays
    ``running``: its suspension was not emitted, and the target emits it when the attempt
    suspends."""
    if st.status != StageStatus.RUNNING or st.attempt <= 0 or st.suspensions <= 0:
        return st
    if st.suspended_in is not None:
        return _suspended(st, st.suspended_in) if _still_open(st, st.suspended_in) else st
    waits = [step for step in st.steps if step.kind != "run"]
    if len(waits) != 1:
        return st
    (wait,) = waits
    if wait.kind != "signal" or wait.completed or not wait.signal:
        return st
    return _suspended(
        st, SnapshotWait(step=wait.name, until=wait.deadline, waiting_for=f"signal:{wait.signal}")
    )


def _still_open(st: SnapshotStage, wait: SnapshotWait) -> bool:
    """Whether the signal wait ``wait`` is still open in ``st``'s journal: its step not
    completed (with the deadline it suspended with), or an ``after_signal`` gate without a
    timeout, journaled once the signal is taken."""
    reason, _, name = wait.waiting_for.partition(":")
    if reason != "signal" or not name:
        return False
    journaled = [s for s in st.steps if s.name == wait.step]
    if not journaled:
        return wait.step == name and wait.until is None
    step = journaled[0]
    return (
        step.kind == "signal"
        and not step.completed
        and step.signal == name
        and step.deadline == wait.until
    )


def _suspended(st: SnapshotStage, wait: SnapshotWait) -> SnapshotStage:
    return st.model_copy(
        update={
            "status": StageStatus.SUSPENDED,
            "waiting_for": wait.waiting_for,
            "wake_at": wait.until,
            "suspended_in": wait,
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

    The step is the snapshot's ``suspended_in`` when it names the wait the stage is in (a
    last emitted suspension elsewhere: None, the source did not emit this one); without it,
    read from the journal (``current_wait``: the stage's one uncompleted signal wait of the
    name with the stage's deadline, or the ``after_signal`` gate). (A Temporal run started
    before 2026-12-06 numbered its suspensions instead: its id differs, and the target
    emits the step's id once, as it did.)"""
    if st.status != StageStatus.SUSPENDED or st.attempt <= 0 or st.suspensions <= 0:
        return None
    if not (st.waiting_for or "").startswith("signal:"):
        return None
    wait = st.suspended_in if st.suspended_in is not None else current_wait(st)
    if wait is None or (wait.waiting_for, wait.until) != (st.waiting_for, st.wake_at):
        return None
    draft = Lifecycle(snap.run_id, snap.redrive_count).stage_suspended(
        st.id, st.attempt, wait.step, st.suspensions, "signal", st.wake_at, wait.waiting_for
    )
    return draft.id
