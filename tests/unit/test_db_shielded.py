"""``_db._shielded``: ``await asyncio.shield(coro)``, with ``coro`` started at once (no task
when it never suspends) and handed to a task of its own at its first suspension."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from driver_native._db import _shielded

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="caller")


async def _plain(log: list[str]) -> int:
    VAR.set("inside")  # (a copy of the caller's context: the caller does not see it)
    log.append(VAR.get())
    return 7


def test_a_coroutine_that_never_suspends_returns_in_the_callers_context_copy() -> None:
    async def main() -> None:
        log: list[str] = []
        assert await _shielded(_plain(log), set()) == 7
        assert log == ["inside"]
        assert VAR.get() == "caller"

    asyncio.run(main())


def test_its_error_is_the_callers() -> None:
    async def fails() -> None:
        raise ValueError("no")

    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise KeyError("later")

    async def main() -> None:
        with pytest.raises(ValueError, match="no"):
            await _shielded(fails(), set())
        with pytest.raises(KeyError, match="later"):
            await _shielded(fails_later(), set())

    asyncio.run(main())


def test_a_suspended_coroutine_goes_on_in_a_task_the_callers_cancel_does_not_stop() -> None:
    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()
        done: list[object] = []

        async def body() -> str:
            VAR.set("body")
            first = asyncio.current_task()
            started.set()
            await release.wait()  # (suspends: the rest runs in the shield's task)
            done.append((VAR.get(), asyncio.current_task() is first))
            await asyncio.sleep(0.01)
            done.append(VAR.get())
            return "ok"

        going_on: set[asyncio.Task[None]] = set()

        async def caller() -> str:
            return await _shielded(body(), going_on)

        outer = asyncio.create_task(caller())
        await started.wait()
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        # what is left of it is held where the database's settle() finds it
        assert len(going_on) == 1
        release.set()
        await asyncio.wait(set(going_on), timeout=5)
        # the body ran to its end, in its own context, after its caller was cancelled
        assert done == [("body", False), "body"]
        assert not going_on
        assert VAR.get() == "caller"
        # and a caller that stays gets the result
        release.clear()
        later = asyncio.create_task(caller())
        await asyncio.sleep(0)
        release.set()
        assert await later == "ok"

    asyncio.run(main())


def test_a_caller_suspends_even_when_the_coroutine_does_not() -> None:
    async def main() -> None:
        order: list[str] = []

        async def other() -> None:
            order.append("other")

        task = asyncio.get_running_loop().create_task(other())
        await _shielded(_plain([]), set())
        order.append("caller")
        await task
        assert order == ["other", "caller"]

    asyncio.run(main())
