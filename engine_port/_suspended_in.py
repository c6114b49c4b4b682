"""Which wait a stage's attempt suspended in: the ``suspended_in`` an export writes into a
snapshot's stage (``SnapshotStage.suspended_in``), read back from what the source kept.

A ``stage.suspended`` id names the run, its redrive count, the stage, the attempt, the
suspending step and the time it waits until (``Lifecycle.stage_suspended``). A source that
keeps the events it emitted but not the step (the native driver's outbox: the event's data
holds ``waiting_for`` and ``until``) finds the step by computing the id of each step the
attempt could have suspended in and keeping the one that matches: a match also says that the
suspension is the current attempt's. A stage suspended right now is in the wait its
``waiting_for`` names; its step is read from its journal (``current_wait``).
"""

from __future__ import annotations

from datetime import datetime

from ._lifecycle import Lifecycle
from ._models import SnapshotStage, SnapshotWait, StageStatus

__all__ = ["current_wait", "wait_of_suspension"]


def wait_of_suspension(
    run_id: str,
    redrive_count: int,
    st: SnapshotStage,
    event_id: str,
    *,
    until: datetime | None,
    waiting_for: str | None,
    gate: str | None = None,
) -> SnapshotWait | None:
    """The wait of ``st``'s current attempt whose ``stage.suspended`` has the id
    ``event_id`` (one emitted with ``until`` and ``waiting_for``, when known); None when no
    step the attempt could have suspended in has that id (another attempt's, or an id that
    numbered the suspensions: a Temporal run started before 2026-12-06).

    The steps tried: every step of the journal, and the signal ``waiting_for`` names (the
    ``after_signal`` gate, which journals nothing while it waits without a timeout). With
    ``waiting_for`` unknown (a stage no longer waiting): the journal's signal waits and the
    stage's ``gate`` (its ``after_signal``), each with its signal as ``waiting_for``."""
    if st.attempt <= 0:
        return None
    candidates: list[tuple[str, str]] = []
    if waiting_for:
        name = waiting_for.partition(":")[2]
        candidates += [(s.name, waiting_for) for s in st.steps]
        if name:
            candidates.append((name, waiting_for))
    else:
        candidates += [
            (s.name, f"signal:{s.signal}") for s in st.steps if s.kind == "signal" and s.signal
        ]
        if gate:
            candidates.append((gate, f"signal:{gate}"))
    ids = Lifecycle(run_id, redrive_count)
    for step, reason_name in candidates:
        reason = reason_name.partition(":")[0]
        draft = ids.stage_suspended(
            st.id, st.attempt, step, st.suspensions, reason, until, reason_name
        )
        if draft.id == event_id:
            return SnapshotWait(step=step, until=until, waiting_for=reason_name)
    return None


def current_wait(st: SnapshotStage) -> SnapshotWait | None:
    """The wait ``st``, a stage suspended right now, is in, read from its ``waiting_for``,
    its ``wake_at`` and its journal; None for any other stage, or when the journal does not
    say.

    A signal wait: the stage's one uncompleted signal wait of the name with the stage's
    deadline; with none journaled and no deadline, the ``after_signal`` gate (it journals
    nothing while it waits), whose step is the name (``Steps._gate``). A sleep or a poll:
    the uncompleted step of the name."""
    if st.status != StageStatus.SUSPENDED or st.attempt <= 0 or not st.waiting_for:
        return None
    reason, _, name = st.waiting_for.partition(":")
    if not name:
        return None
    found = SnapshotWait(step=name, until=st.wake_at, waiting_for=st.waiting_for)
    if reason != "signal":
        same = [s for s in st.steps if s.name == name and not s.completed]
        return found if same and same[0].kind == reason else None
    open_waits = [s for s in st.steps if s.kind == "signal" and not s.completed]
    if len(open_waits) > 1:
        return None
    if open_waits:
        (wait,) = open_waits
        if wait.signal != name or wait.deadline != st.wake_at:
            return None
        return found.model_copy(update={"step": wait.name})
    if st.wake_at is not None or any(s.name == name for s in st.steps):
        return None
    return found  # (the gate of ``after_signal``)
