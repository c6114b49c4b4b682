"""PostgreSQL transactions run on the event loop: sync code, round trips the loop can wait out.

A transaction function is sync code (SQLAlchemy Core, ``_rawsql``, ``_pgbatch`` on the DBAPI
cursor). Run on a database thread, each transaction pays a hop there and back, and the two
threads take turns at the GIL: ~20% of a lone 3-stage run (bench/README.md, "PostgreSQL
transactions on the event loop's thread"). Run on the loop's thread with a blocking
connection, it holds the loop for its round trips, and deadlocks when the loop itself is what
the database waits for (an asyncio proxy or tunnel in the same process).

Here the function runs in a greenlet on the loop (as SQLAlchemy's asyncio extension runs
``run_sync``), on a psycopg connection whose waits for the server (:meth:`LoopConnection.wait`,
which psycopg calls for each query, commit and rollback) go through the loop when made from
such a greenlet, and block as usual on any other thread. A transaction alone in flight on the
loop first waits for its answer in a blocking poll of at most :data:`BLOCK_SECONDS` (on a
nearby server the answer is there by then, and going through the loop for it would cost more
CPU than the wait); past that, or with other transactions in flight, the loop waits for it, so
the loop is never held longer than that and never for another transaction's sake.

Connections are opened and checked out of the pool on a database thread (a connect, and a wait
for a full pool, block), then held for the loop's transactions (:class:`LoopConnections`).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, NamedTuple, TypeVar

import psycopg
from greenlet import getcurrent, greenlet  # type: ignore[import-untyped]
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, event
from sqlalchemy.engine import Engine
from sqlalchemy.util.concurrency import await_, in_greenlet

__all__ = ["BLOCK_SECONDS", "LoopConnection", "LoopConnections"]

T = TypeVar("T")

BLOCK_SECONDS = 0.002
"""How long a transaction alone in flight blocks the loop waiting for one answer, at most."""

_KEEP_RUNNERS = 16
"""Idle greenlets kept per thread for :meth:`LoopConnections.run`."""

_R, _W = 1, 2  # psycopg's Wait.R / Wait.W and Ready.R / Ready.W


class LoopConnection(psycopg.Connection[Any]):
    """A psycopg connection whose waits for the server go through the event loop when made
    from a greenlet of :meth:`LoopConnections.run` (and block as usual anywhere else)."""

    owner: LoopConnections | None = None  # (set when the loop takes it)

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        owner = self.owner
        if owner is None or not in_greenlet():
            return super().wait(gen, interval, timeout)
        try:
            return _wait(gen, self.pgconn.socket, owner.block_seconds(), timeout)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # (the loop is closing under it): a query may be half sent or half read, so
                # the connection is closed and its pooled record dropped by the caller
                self.pgconn.finish()
            raise

    def commit(self) -> None:
        # Inside Database.tx the COMMIT goes out with the deferred writes (``_db._commit``):
        # the commit SQLAlchemy makes next finds the connection idle. psycopg finds that under
        # its lock, with its commit generator run through wait(); the same checks, without.
        if (
            self.pgconn.transaction_status == TransactionStatus.IDLE
            and not self._num_transactions
            and self._tpc is None
        ):
            return
        super().commit()


def _wait(gen: Any, fileno: int, block: float, timeout: float | None) -> Any:
    """Run psycopg's generator ``gen`` to its end: each time it would block, poll the socket
    (blocking up to ``block`` for an answer), and when it is not ready wait on the loop."""
    try:
        s = next(gen)
        while True:
            r, w, _ = select.select(
                [fileno] if s & _R else [], [fileno] if s & _W else [], [], block if s & _R else 0
            )
            ready = (_R if r else 0) | (_W if w else 0)
            s = gen.send(ready or await_(_ready(fileno, s, timeout)))
    except StopIteration as ex:
        return ex.value
    except OSError as ex:
        raise psycopg.OperationalError("connection socket closed") from ex


async def _ready(fileno: int, s: int, timeout: float | None) -> int:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()

    def wake(state: int) -> None:
        if not fut.done():
            fut.set_result(state)

    def expire() -> None:
        if not fut.done():
            fut.set_exception(psycopg.errors._WaitTimeout("wait timeout expired"))

    if s & _R:
        loop.add_reader(fileno, wake, _R)
    if s & _W:
        loop.add_writer(fileno, wake, _W)
    # (a timer, not asyncio.timeout: that cancels the task current when it is entered, and
    # this may be entered before the transaction's task exists, see _db._shielded)
    timer = None if timeout is None else loop.call_later(timeout, expire)
    try:
        return await fut
    finally:
        if timer is not None:
            timer.cancel()
        if s & _R:
            loop.remove_reader(fileno)
        if s & _W:
            loop.remove_writer(fileno)


class _Done(NamedTuple):
    """What a :class:`_Runner` hands back when its function has ended."""

    value: Any
    error: BaseException | None


class _Runner(greenlet):  # type: ignore[misc]
    """A greenlet that runs sync functions one after the other, each called from a task by
    :meth:`LoopConnections.run`: made once and kept (making and starting a greenlet per
    transaction, as SQLAlchemy's ``greenlet_spawn`` does, cost ~10 us of CPU, more than the
    Python work of many transactions). An ``await_`` in the function switches to that task
    with the awaitable, which the task awaits, as with ``greenlet_spawn``."""

    __sqlalchemy_greenlet_provider__ = True  # (what SQLAlchemy's await_ and in_greenlet ask)

    def __init__(self) -> None:
        super().__init__(self._serve)

    def _serve(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        while True:
            try:
                done = _Done(fn(*args), None)
            except BaseException as exc:  # (handed to the task, which raises it)
                done = _Done(None, exc)
            fn = args = None  # type: ignore[assignment]  # (nothing kept while idle)
            fn, args = self.parent.switch(done)


def _end(runner: _Runner) -> None:
    """Ends an idle runner that is not kept. Dropped instead, it stayed parked for the life of
    the process with its last function's result (and through it the engine): a parked
    greenlet's frame is not seen by the garbage collector. A worker that ran more than
    ``_KEEP_RUNNERS`` transactions at once leaked one per extra, and a closed engine all."""
    runner.parent = getcurrent()  # (the ended greenlet returns here)
    runner.throw()


def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> LoopConnection:
    """SQLAlchemy's ``do_connect`` hook: the pool's connections are :class:`LoopConnection`."""
    return LoopConnection.connect(*cargs, **cparams)


class LoopConnections:
    """The pooled connections the loop's transactions run on: checked out on a database thread
    when none is free, held between transactions (up to ``keep``; the rest go back to the
    pool, which the database threads share)."""

    def __init__(self, engine: Engine, executor: Executor, keep: int) -> None:
        self.engine = engine
        self.executor = executor
        self.keep = keep
        self.idle: list[Connection] = []
        self.in_flight = 0
        # idle greenlets for run(), per thread (a greenlet runs only on the thread it was
        # made on)
        self.runners: dict[int, list[_Runner]] = {}
        event.listen(engine, "do_connect", _connect)

    def block_seconds(self) -> float:
        return BLOCK_SECONDS if self.in_flight == 1 else 0.0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a greenlet on the running loop (in the calling task's context)."""
        idle = self.runners.setdefault(threading.get_ident(), [])
        runner = idle.pop() if idle else _Runner()
        driver = getcurrent()
        runner.parent = driver
        runner.gr_context = driver.gr_context
        self.in_flight += 1
        try:
            step = runner.switch(fn, args)
            while not isinstance(step, _Done):  # an awaitable, from await_ in fn
                try:
                    value = await step
                except BaseException:
                    step = runner.throw(*sys.exc_info())
                else:
                    step = runner.switch(value)
        finally:
            self.in_flight -= 1
        runner.gr_context = None
        if len(idle) < _KEEP_RUNNERS and self.runners.get(threading.get_ident()) is idle:
            idle.append(runner)
        else:  # (more than kept run at once, or closed meanwhile)
            _end(runner)
        if step.error is not None:
            raise step.error
        result: T = step.value
        return result

    async def take(self) -> Connection:
        if self.idle:
            return self.idle.pop()
        loop = asyncio.get_running_loop()
        conn = await loop.run_in_executor(self.executor, self.engine.connect)
        raw: Any = conn.connection.dbapi_connection
        if isinstance(raw, LoopConnection):
            raw.owner = self
        return conn

    def give(self, conn: Connection, *, usable: bool) -> None:
        """Back after a transaction or read; ``usable=False`` (an error left it in an unknown
        state) drops it."""
        if usable and len(self.idle) < self.keep and _idle(conn):
            self.idle.append(conn)
        else:
            _drop(conn)

    def close(self) -> None:
        runners, self.runners = self.runners, {}
        for runner in runners.get(threading.get_ident(), ()):
            _end(runner)
        idle, self.idle = self.idle, []
        for conn in idle:
            _drop(conn)


def _idle(conn: Connection) -> bool:
    """Open, and between transactions (nothing sent or read half-way)."""
    if conn.invalidated or conn.closed:
        return False
    raw: Any = conn.connection.dbapi_connection
    if raw is None or raw.closed:
        return False
    return bool(raw.info.transaction_status == TransactionStatus.IDLE)


def _drop(conn: Connection) -> None:
    """Back to the pool (its waits block again), or closed for good when it is not between
    transactions.

    A connection SQLAlchemy invalidated (the server cut it: a terminated backend, a restart)
    gave its pool slot back then; it is only closed here. Its ``conn.connection`` must not be
    read: on an invalidated Connection that property silently checks out a replacement, on
    the loop's thread, which blocks the whole loop for the pool's timeout (30 s) when the pool
    is exhausted, as it is right after the server cut every connection and the retries of the
    other transactions wait for one on the database threads. A worker's loop held that long
    sends no heartbeat, and its leases are taken over while it is alive."""
    if conn.invalidated or conn.closed:
        with contextlib.suppress(Exception):
            conn.close()  # (no I/O, no checkout: just marks the Connection closed)
        return
    with contextlib.suppress(Exception):
        raw: Any = conn.connection.dbapi_connection
        if isinstance(raw, LoopConnection):
            raw.owner = None
        if not _idle(conn):
            conn.invalidate()
        conn.close()
