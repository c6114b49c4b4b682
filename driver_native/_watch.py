"""``wait()`` for runs that workers elsewhere execute: one status query per tick for every run
waited for, instead of one per waiting call.

Each wait keeps its own backoff (its first look after ``first`` seconds, growing by half up to
``longest``; a run a worker of this process executes is looked at every ``_LOCAL_POLL_S`` only,
since its end wakes the wait at once), and the waits due within the same ``tick`` share one
query. A thousand callers waiting for a thousand runs cost at most ``1 / tick`` queries a
second (each reading the runs due), not ~10 queries a second per run: an API process waiting
for its requests' runs no longer loads the database in proportion to them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from engine_port.driver import TERMINAL_RUN_STATUSES

__all__ = ["RunWatch"]

_TERMINAL = frozenset(str(s) for s in TERMINAL_RUN_STATUSES)


@dataclass(eq=False)
class Watched:
    """One waiting call: its ``event`` is set when the run ended (or the look failed: the
    caller reads the run itself and sees why)."""

    run_id: str
    event: asyncio.Event
    delay: float
    longest: float
    due: float = field(default=0.0)


class RunWatch:
    def __init__(
        self,
        read: Callable[[list[str]], Awaitable[dict[str, str]]],
        *,
        tick: float = 0.01,
        first: float = 0.01,
        longest: float = 0.1,
    ) -> None:
        """``read(run_ids)``: {run id: status} of those that exist."""
        self._read = read
        self.tick = tick
        self.first = first
        self.longest = longest
        self._watched: set[Watched] = set()
        self._changed = asyncio.Event()  # (made anew with each task: the caller's loop)
        self._task: asyncio.Task[None] | None = None
        # when the task, waiting, looks again by itself (a watch due later needs no wake-up)
        self._wakes_at = 0.0

    def watch(self, run_id: str, event: asyncio.Event, *, every: float | None = None) -> Watched:
        """Look at ``run_id`` from now on until :meth:`unwatch` (``every``: a fixed period
        instead of the backoff)."""
        delay = self.first if every is None else every
        entry = Watched(run_id, event, delay, self.longest if every is None else every)
        entry.due = time.monotonic() + delay
        self._watched.add(entry)
        if self._task is None or self._task.done():
            self._changed = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name="wfe-run-watch")
        elif entry.due < self._wakes_at:
            # (else the waiting task looks again before it is due: a wait() per run of a
            # local worker, due in _LOCAL_POLL_S, woke the task, and it slept again, per run)
            self._changed.set()
        return entry

    def unwatch(self, entry: Watched) -> None:
        self._watched.discard(entry)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while self._watched:
            now = time.monotonic()
            due = [e for e in self._watched if e.due <= now + self.tick / 2]
            if due:
                await self._look(due)
            if not self._watched:
                return
            self._changed.clear()
            now = time.monotonic()
            pause = max(min(e.due for e in self._watched) - now, self.tick)
            self._wakes_at = now + pause
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._changed.wait()
            self._wakes_at = 0.0  # (looking: a watch added meanwhile is seen after the look)

    async def _look(self, due: Collection[Watched]) -> None:
        try:
            statuses = await self._read(sorted({e.run_id for e in due}))
        except Exception:
            statuses = None  # (each caller reads its run itself: the error is theirs to see)
        now = time.monotonic()
        for e in due:
            status = None if statuses is None else statuses.get(e.run_id)
            if status is None or status in _TERMINAL:
                e.event.set()  # ended, gone, or the look failed
                e.due = now + e.longest  # (until its caller takes it out)
            else:
                e.delay = min(e.delay * 1.5, e.longest)
                e.due = now + e.delay
