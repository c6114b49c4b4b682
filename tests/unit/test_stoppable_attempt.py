"""A stage attempt runs in its job's task (``driver_native._kernel._stoppable``): the cancels
its heartbeats and ledger make (the lease found gone) stop it as they stopped the attempt's
own task, and are told apart from the host's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from driver_native._kernel import _stoppable, _Stops


class _NoBeat:
    stopped = 0

    async def stop(self) -> None:
        self.stopped += 1


async def _in_task(attempt: Any) -> tuple[Any, int, bool]:
    """``_stoppable(attempt(stop))`` in a task; (its result, the task's cancelling() after,
    whether an await after it went through)."""

    async def job() -> tuple[Any, int, bool]:
        task = asyncio.current_task()
        assert task is not None
        stop, beat = _Stops(task), _NoBeat()
        result = await _stoppable(attempt(stop), stop, beat)  # type: ignore[arg-type]
        assert beat.stopped == 1
        await asyncio.sleep(0)  # (no cancel of ours left behind)
        return result, task.cancelling(), True

    return await asyncio.create_task(job())


async def test_an_attempt_that_ends_untouched_returns_its_result() -> None:
    async def attempt(stop: _Stops) -> str:
        await asyncio.sleep(0)
        return "done"

    assert await _in_task(attempt) == ("done", 0, True)


async def test_a_cancel_delivered_to_the_attempt_stops_it() -> None:
    async def attempt(stop: _Stops) -> str:
        stop.cancel()
        await asyncio.sleep(1)
        return "not reached"

    assert await _in_task(attempt) == (None, 0, True)


async def test_a_cancel_made_as_the_attempt_ends_stops_it_all_the_same() -> None:
    async def attempt(stop: _Stops) -> str:
        stop.cancel()  # (a ledger write found the lease gone; nothing awaited after it)
        return "done"

    assert await _in_task(attempt) == (None, 0, True)


async def test_an_attempt_that_catches_the_cancel_and_returns_is_recorded() -> None:
    async def attempt(stop: _Stops) -> str:
        stop.cancel()
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            return "caught"
        return "not reached"

    assert await _in_task(attempt) == ("caught", 0, True)


async def test_the_hosts_cancel_goes_on() -> None:
    started = asyncio.Event()

    async def attempt(stop: _Stops) -> str:
        started.set()
        await asyncio.sleep(1)
        return "not reached"

    task = asyncio.create_task(_in_task(attempt))
    await started.wait()
    inner = [t for t in asyncio.all_tasks() if t is not task and t is not asyncio.current_task()]
    for t in inner:
        t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_hosts_cancel_beside_one_of_ours_goes_on() -> None:
    async def attempt(stop: _Stops) -> str:
        stop.cancel()
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # (the host's, at the same time)
        return "done"

    with pytest.raises(asyncio.CancelledError):
        await _in_task(attempt)
