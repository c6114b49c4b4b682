"""SQLite: a transaction run inline on the event loop is a suspension point (``Database.tx``
lets the loop's other tasks run first, as the hop to the database thread did), except for a
caller that suspends, or ends its task, right after it (``tx_then_yield``: a lone stage
outcome's record), which takes no turn of the loop of its own, as on PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from driver_native._db import Database


def test_tx_yields_first_and_tx_then_yield_does_not(tmp_path: Path) -> None:
    async def main() -> None:
        db = Database(f"sqlite:///{tmp_path / 'wfe.db'}")
        order: list[str] = []

        async def other() -> None:
            order.append("other")

        def fn(_conn: Any) -> int:
            order.append("tx")
            return 1

        try:
            task = asyncio.get_running_loop().create_task(other())
            assert await db.tx(fn) == 1
            await task
            assert order == ["other", "tx"]
            order.clear()
            task = asyncio.get_running_loop().create_task(other())
            assert await db.tx_then_yield(fn) == 1
            assert order == ["tx"]  # (inline, before the other task's turn)
            await task
            assert order == ["tx", "other"]
        finally:
            db.dispose()

    asyncio.run(main())
