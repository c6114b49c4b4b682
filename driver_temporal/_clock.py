"""The run's clock (a base of ``_outbox.EventOutbox``): the time the workflow gives its events,
its stages' and its own start and end times, the deadlines it computes and the memo's
``updated_at``.

``workflow.now()`` is the time of the workflow *activation*, which sdk-core sets from the
history: the started time of the workflow task, or, in the activation that hands the workflow
a local activity's result, the local activity's completion time (the workflow time when it was
scheduled plus its run time, which its ``MarkerRecorded`` event keeps), whichever is later.
That is the same live and on replay only while both see the local activity's result in the
same workflow task, and a query breaks that. sdk-core answers a query that comes with a task
(``engine.signal`` asks one right after its signal; the Web UI asks some) while a local
activity of the task runs, or has reported before the workflow heard it, by completing the
task at once and having Temporal start a new one (``force_create_new_workflow_task``); the
workflow then hears the result in the new task:

- live at the new task's started time, where a replay, finding the marker in the first task,
  hands the result over there, at the marker's time (the local activity had reported);
- when the first task had issued no command (the usual case: a run writes its memo only once
  its local activities reported), a replay takes it for a heartbeat of the new one and runs its
  activation at the new task's started time: everything the workflow did before the local
  activity reported gets that later time, and so does the local activity's scheduling;
- CI saw it the other way round too: the result heard live at the marker's time and on replay
  at the new task's (the marker recorded by the new task, the result heard live while the
  first one was being completed).

Each way the events the workflow built get other times on replay than the sink received
(``engine.events`` differed from the sink, ``test_history_events`` on a loaded CI host), and so
do the stage times of the run's state.

So on runs started with ``clock = "locals"`` (``StartDocument.clock``) the clock reads, once a
local activity reported in an activation and while the activation lasts (its ``workflow.now()``
unchanged), that local activity's own time: the clock's reading when the workflow scheduled it
plus the run time its result reports (``took_s``, measured by the stage activity:
``_activities.ActivityHost.stage``), both the same live and on replay. The scheduling reading is
the one the live run had: the local activity's input carries it (``clock``) and its result
gives it back (the marker keeps the result, never the input). A replay whose own reading
differs ran that activation at another time than the live run (the heartbeat case above): it
gives the events the workflow built in it and the stage times it set then the live reading
(``_retime``). A local activity that reports no run time ends, for the clock, its timeout
after its scheduling when it timed out, at its scheduling otherwise (one of the driver's own);
a cancelled one leaves the activation's time.
These times come before the activation's (the run time measured inside the local activity is
within the one sdk-core measures), so the run's times never go back from one activation to the
next. Runs started before read the activation's time throughout, and replay so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from engine_port import Event

__all__ = ["LocalMark", "RunClock"]


@dataclass(frozen=True)
class LocalMark:
    """A local activity's scheduling: the clock's reading then, and the events stamped in
    that activation (the same list: those stamped later in it join it)."""

    at: datetime
    stamped: list[tuple[dict[str, Any], datetime]]


class RunClock:
    """``_now``: the run's time (see the module docstring). ``GraphWorkflow`` sets
    ``_clock_from_locals`` from its start document."""

    # runs started with ``clock = "locals"``
    _clock_from_locals: bool = False
    # (activation time, the time to read instead) since a local activity reported in it
    _local_time: tuple[datetime, datetime] | None = None
    # (activation time, the events stamped in it with the time each got)
    _stamped: tuple[datetime, list[tuple[dict[str, Any], datetime]]] | None = None

    def _now(self) -> datetime:
        """The run's time: ``workflow.now()``, except in an activation where a local activity
        reported on a run with the ``clock`` mark."""
        now = workflow.now()
        local = self._local_time
        if local is not None and local[0] == now:
            return local[1]
        return now

    def _stamp(self, event: dict[str, Any], at: datetime) -> None:
        """An event built now, at ``at`` (as JSON): kept with the activation's others while
        the activation lasts, in case a local activity scheduled in it reports that the live
        run had another reading (``_local_reported``)."""
        if not self._clock_from_locals:
            return
        now = workflow.now()
        if self._stamped is None or self._stamped[0] != now:
            self._stamped = (now, [])
        self._stamped[1].append((event, at))

    def _scheduling(self) -> LocalMark:
        """The mark of a local activity scheduled now: give ``at`` to its input (``clock``)."""
        now = workflow.now()
        if self._stamped is None or self._stamped[0] != now:
            self._stamped = (now, [])
        return LocalMark(self._now(), self._stamped[1])

    def _local_reported(self, mark: LocalMark, took_s: Any = None, clock: Any = None) -> None:
        """The local activity scheduled at ``mark`` reported (completed or failed) in this
        activation; ``took_s``: the run time it gives, if any; ``clock``: the reading at its
        scheduling it gives back (``mark.at`` but on a replay that ran that activation at
        another time)."""
        if not self._clock_from_locals:
            return
        at = mark.at
        live = _parsed(clock)
        if live is not None and live != mark.at:
            self._retime(mark, live)
            at = live
        if isinstance(took_s, int | float) and not isinstance(took_s, bool) and took_s > 0:
            at += timedelta(seconds=float(took_s))
        self._local_time = (workflow.now(), at)

    def _retime(self, mark: LocalMark, live: datetime) -> None:
        """(A replay that ran a local activity's scheduling activation at another time than
        the live run, ``mark.at``, where the live run read ``live``.) The events built then
        take the live time, and so do the run's state times (``_retimed``)."""
        for event, at in mark.stamped:
            if at == mark.at:
                event["at"] = Event.model_validate({**event, "at": live}).model_dump(mode="json")[
                    "at"
                ]
        self._retimed(mark.at, live)

    def _retimed(self, was: datetime, live: datetime) -> None:
        """The run's state times read at ``was`` are ``live`` (``GraphWorkflow``)."""


def _parsed(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
