"""Group commit: concurrent write transactions of one kind in one process (run creations,
stage outcomes) share a transaction while an earlier one of that kind is in flight.

On SQLite every write transaction of a process runs on the one database thread and takes the
file's writer lock (BEGIN IMMEDIATE), which the worker processes want too: a burst of starts
(the throughput workload: 16 at a time) paid a BEGIN, a COMMIT and a wait for the lock per run.
On PostgreSQL each paid a BEGIN/COMMIT round trip and a WAL flush (measured side by side, 600
runs, two worker processes: 75 -> 98 and 112 -> 138 runs/s). Here the first start of a burst
commits alone (no added latency); those that arrive while it runs are committed together in the
next transaction. A batch either commits whole or is rolled back whole; after a failure each of
its creations is tried again alone, so each caller sees its own result or error exactly as
without batching.

Stage outcomes are batched the same way: the siblings of a fan-out finishing together, or the
stages of many runs on one worker, each paid a transaction of their own (and on PostgreSQL the
siblings queued for their run's row lock, one commit after the other).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection

from ._db import Database, shared

__all__ = ["TxBatcher"]

MAX_BATCH = 64
"""Transactions shared at most (a short hold of the writer lock)."""

T = TypeVar("T")


def _each(conn: Connection, fn: Callable[..., T], items: list[tuple[Any, ...]]) -> list[T]:
    with shared(conn):
        return [fn(conn, *args) for args in items]


class TxBatcher(Generic[T]):
    """``await batcher.run(*args)`` runs ``fn(conn, *args)`` in a transaction, shared with
    the calls that queued while the previous transaction ran."""

    def __init__(self, db: Database, fn: Callable[..., T]) -> None:
        self.db = db
        self.fn = fn
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[T]]] = []
        self._busy = False
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0  # shared transactions committed (for tests and the bench notes)

    async def run(self, *args: Any, turn: bool = True) -> T:
        """``turn=False``: the caller suspends, or ends its task, right after (see
        :meth:`Database.tx_then_yield`)."""
        if self._busy:
            future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            self._queue.append((args, future))
            return await future
        self._busy = True
        try:
            if turn:
                return await self.db.tx(self.fn, *args)
            return await self.db.tx_then_yield(self.fn, *args)
        finally:
            if self._queue:
                self._drainer = asyncio.create_task(self._drain())
            else:
                self._busy = False

    async def _drain(self) -> None:
        batch: list[tuple[tuple[Any, ...], asyncio.Future[T]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                await self._commit(batch)
        except BaseException:
            # (cancelled with the engine's loop): nobody may wait forever
            for _, future in batch + self._queue:
                if not future.done():
                    future.cancel()
            self._queue = []
            raise
        finally:
            self._busy = False
            self._drainer = None

    async def _commit(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[T]]]) -> None:
        if len(batch) > 1:
            try:
                results = await self.db.tx(_each, self.fn, [args for args, _ in batch])
            except Exception:
                pass  # one of them failed: each alone, so each gets its own outcome
            else:
                self.batches += 1
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
                return
        for args, future in batch:
            try:
                result = await self.db.tx(self.fn, *args)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(result)
