"""Pages of a Temporal-driver run's events (``engine.events(run_id, after_seq=, limit=)``).

A run's events are not stored one by one in Temporal: they are rebuilt by replaying every
workflow history of the run (``_history_events``), so a page costs the replay of the whole
run, however small it is. A page loop would replay the run once per page (a run of n events
read by pages of k: n/k replays). So the engine keeps the replayed events of the last run it
paged (:class:`EventPages`: one run, never more) and serves the next pages from them while
the run's latest execution has the same history: the same execution (a redrive or a
continue-as-new starts another) and the same history length (a running run's next workflow
task lengthens it). The entry is dropped by the page that reaches the end of the run.

Not kept: a replay whose sequence numbers do not run 1, 2, 3, ... (the visibility store had not
listed an earlier execution of the run yet, or a closing event a worker published sits between
two executions): such a run is replayed for every page, as ``engine.events(run_id)`` replays
it for every call.

What a page saves is what the caller gets and holds (a page, not the run's every event); the
first page of a loop still replays the whole run, with the memory that takes, and the engine
holds the run's events until the loop's last page (or the next loop, of another run).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Awaitable, Callable, Sequence

from engine_port import Event

__all__ = ["EventPages", "page_of"]

HistoryKey = tuple[str, str, int]
"""The run id, its latest execution's id and that execution's history length."""


def page_of(events: Sequence[Event], after_seq: int | None, limit: int | None) -> list[Event]:
    """Of ``events`` (in sequence order), those with a ``seq`` above ``after_seq``, at most
    ``limit``."""
    start = 0 if after_seq is None else bisect_right(events, after_seq, key=_seq)
    return list(events[start : None if limit is None else start + limit])


def _seq(event: Event) -> int:
    return event.seq


def _numbered_from_one(events: Sequence[Event]) -> bool:
    return all(e.seq == i for i, e in enumerate(events, 1))


class EventPages:
    """The replayed events of the run paged last, by the history they were replayed from."""

    def __init__(self) -> None:
        self._key: HistoryKey | None = None
        self._events: list[Event] = []

    async def replayed(
        self, key: HistoryKey, replay: Callable[[], Awaitable[list[Event]]]
    ) -> list[Event]:
        """The run's replayed events: kept ones when ``key`` is the history they were
        replayed from, else ``replay()``'s (kept when numbered 1, 2, 3, ...)."""
        if key == self._key:
            return self._events
        self.forget()
        found = await replay()
        if _numbered_from_one(found):
            self._key, self._events = key, found
        return found

    def ended(self, run_id: str) -> None:
        """A page loop over ``run_id`` read its last page: its events are not needed again."""
        if self._key is not None and self._key[0] == run_id:
            self.forget()

    def forget(self) -> None:
        self._key, self._events = None, []
