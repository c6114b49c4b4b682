"""Database access: one SQLAlchemy engine, transactions run on a small thread pool.

SQLite runs in WAL mode with one writer at a time (BEGIN IMMEDIATE, busy_timeout, a single
executor thread per process); a transaction or read awaited on the event loop runs right there,
without the hop to that thread, when the writer lock is free (:class:`_Held`). PostgreSQL uses
psycopg 3 and a pool.

Transient errors (a dropped or terminated connection, a server restarting, a serialisation
failure, SQLite's "database is locked" after its busy timeout) are retried: the whole
transaction function runs again on a fresh connection, with exponential backoff, for up to
``retry_seconds``; after that the call raises :class:`DriverUnavailableError`. Configuration
errors (no such database, user or host) are raised at once. A transaction function is one unit
that either committed or did not, and none has effects outside the database (the kernel's
blob writes happen before or after its transactions), so running it again is safe, with one
case to design for: a commit whose acknowledgement was lost with the connection, after which
the function runs again against its own committed result. The database layer knows when an
earlier try failed while committing and says so to the re-run (:func:`commit_was_unknown`),
so the checks below cost nothing on the normal path. What a re-run then sees:

- a stage outcome: its lease is already given up, so it reports ``discarded`` (the kernel keeps
  the output blob that the first try stored); ``begin_attempt`` resumes the attempt it began;
- a step write is an upsert; a signal take finds its step journaled and returns that payload;
- a compensation's record finds the stage compensated (or its error kept) and writes nothing;
  the compensation's end finds the run ended (and its job gone) and reports it compensated;
- a start finds its own run (same id, input and creation time) and returns it; a command
  idempotency key finds itself taken at the same instant and goes on;
- not made safe: a ``signal`` without ``idempotency_key`` is queued a second time (senders
  that need exactly once pass a key); jobs leased by a lost ``ClaimPending`` (or handed off by
  a lost outcome) wait for their lease to expire, then run with their attempt kept; a sink
  failure counts twice towards dead-lettering; a ``redrive`` reports the run as not terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import sqlite3
import threading
import time
import types
from collections.abc import Callable, Coroutine, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from engine_port.driver import redact_text, redact_url
from engine_port.errors import ConfigurationError, DriverUnavailableError

from . import _schema
from ._pgbatch import send_batch, send_commit

if TYPE_CHECKING:
    from ._pgloop import LoopConnections

__all__ = [
    "PREPARED",
    "Database",
    "Unpredicted",
    "commit_was_unknown",
    "commit_with_next",
    "cursors",
    "defer",
    "deferred",
    "forget_cursors",
    "queue_later",
    "refused",
    "send_raw",
    "send_together",
    "shared",
    "speculating",
]

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("wfe.db")

RETRY_SECONDS = 10.0
"""How long a transaction is retried on transient connection errors before the call raises
DriverUnavailableError (long enough for a PostgreSQL failover or restart)."""
_FIRST_DELAY = 0.05
_MAX_DELAY = 2.0


_COMMIT_UNKNOWN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "wfe_commit_unknown", default=False
)


def commit_was_unknown() -> bool:
    """Inside a transaction function: True when this run of it is a retry after an earlier try
    failed while committing, so that try may have committed (its acknowledgement was lost with
    the connection). A function whose re-run would not be safe checks for its own earlier
    write only then (no extra query on the normal path)."""
    return _COMMIT_UNKNOWN.get()


class _Try:
    """The state of one retried transaction across its tries."""

    __slots__ = ("commit_unknown", "committing", "conn", "held")

    def __init__(self, held: _Held | None = None) -> None:
        self.commit_unknown = False  # an earlier try failed while committing
        self.committing = False  # this try's function returned: it is committing
        self.held = held  # SQLite: the held connection this try runs on (see _Held)
        self.conn: Connection | None = None  # PostgreSQL: the loop's connection (_pgloop)

    def failed(self) -> None:
        self.commit_unknown = self.commit_unknown or self.committing


class _WriterBusy(Exception):
    """An inline SQLite try found the database busy before it did anything: the transaction
    goes to the database thread instead (which waits for the lock there)."""


async def _shielded(
    coro: Coroutine[Any, Any, T], going_on: set[asyncio.Task[None]], *, turn: bool = True
) -> T:
    """``await asyncio.shield(coro)``: ``coro`` runs in a task of its own, which cancelling
    the caller does not cancel, and its result or error is the caller's. With one turn of
    the event loop less than ``asyncio.shield`` (whose task's end reaches the caller through
    a done callback, itself scheduled for the next turn): the task hands its result over
    itself.

    ``coro`` is started at once, in a copy of the caller's context as a task would be: up to
    its first suspension nothing can cancel it, so no task is needed for that part. A
    transaction on the loop whose answers come within its blocking poll (``_pgloop``) never
    suspends and ends here, with no task made and no loop turn but the one the caller yields
    after it (as it yielded before: a transaction stays a suspension point). One that
    suspends goes on in a task (in the same context) from where it stopped.

    ``turn=False``: a caller that suspends (or ends its task) right after has that turn
    already; one that never suspended returns at once, without a loop turn of its own.

    The task is in ``going_on`` until it ends: its caller may be gone (a heartbeat cancelled
    as its stage ended, a worker's bounded last flush), and the database's :meth:`Database.
    settle` waits for it before the connections and greenlets it runs on are dropped."""
    context = contextvars.copy_context()
    try:
        step = context.run(coro.send, None)
    except StopIteration as done:
        if turn:
            await asyncio.sleep(0)  # (a suspension point, as the task's turn was)
        result: T = done.value
        return result
    loop = asyncio.get_running_loop()
    outer: asyncio.Future[T] = loop.create_future()

    async def inner() -> None:
        try:
            result = await _resumed(coro, step)
        except asyncio.CancelledError:
            outer.cancel()  # (the task itself was cancelled: the loop is closing)
            raise
        except BaseException as exc:
            if not outer.done():  # (else the caller is gone: as with shield, nobody hears)
                outer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if not outer.done():
                outer.set_result(result)
        finally:
            going_on.discard(task)

    task = loop.create_task(inner(), context=context)  # (held until it ends: going_on)
    going_on.add(task)
    return await outer


@types.coroutine
def _resumed(coro: Coroutine[Any, Any, T], step: Any) -> Generator[Any, Any, T]:
    """The rest of ``coro``, which yielded ``step`` (what a task awaits: a future, or None for
    a bare turn) when it was first sent to: yields it again to the awaiting task, then passes
    what the task sends or throws in on to ``coro``."""
    while True:
        try:
            try:
                value = yield step
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # (thrown in by the task: a cancellation)
                step = coro.throw(exc)
            else:
                step = coro.send(value)
        except StopIteration as done:
            result: T = done.value
            return result


def _normalise_url(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class Database:
    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        retry_seconds: float = RETRY_SECONDS,
        create: bool = True,
    ) -> None:
        """``create=False`` (read-only tools): a missing SQLite file (or its folder) is an
        error instead of being created."""
        self.url = _normalise_url(url)
        self.retry_seconds = retry_seconds
        # transparent retries, for operators (``worker.stats()``, the metrics): every retry
        # of a transaction, and the outages (connections lost or refused) they rode out; an
        # outage is logged once as it begins (WARNING) and once as it ends (INFO)
        self.retries = 0
        self.outages = 0
        self._outage_since: float | None = None
        try:
            parsed = make_url(self.url)
        except ArgumentError:
            raise ConfigurationError(
                f"database_url {redact_url(url)!r} is not a URL; use sqlite:///PATH or "
                "postgresql+psycopg://USER@HOST:PORT/DB"
            ) from None
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self.is_postgres = parsed.get_backend_name() == "postgresql"
        if not (self.is_sqlite or self.is_postgres):
            raise DriverUnavailableError(
                f"database_url {redact_url(url)!r} is not supported; use sqlite:///PATH or "
                "postgresql+psycopg://USER@HOST:PORT/DB"
            )
        if self.is_sqlite:
            db = parsed.database or ""
            if not db or db == ":memory:":
                raise DriverUnavailableError(
                    "the native driver needs a SQLite file (sqlite:///PATH), not an in-memory "
                    "database, so that workers and the CLI share it"
                )
            if not create and not Path(db).is_file():
                raise DriverUnavailableError(
                    f"there is no wfe database at {redact_url(url)!r} yet; create it with "
                    "'wfe db upgrade' (a worker or create_engine() also creates it), or point "
                    "database_url (WFE_DATABASE_URL, wfe.toml) at the one you use"
                )
            Path(db).parent.mkdir(parents=True, exist_ok=True)
            self.engine: Engine = sa.create_engine(
                self.url,
                connect_args={"check_same_thread": False, "timeout": 30},
                json_serializer=_sqlite_json,
            )
            event.listen(self.engine, "connect", _sqlite_on_connect)
            event.listen(self.engine, "begin", _sqlite_on_begin)
            workers = 1
            self._inline = _Held(self.engine, inline=True, on_commit=self._inline_committed)
            self._held = _Held(self.engine, inline=False)
        else:
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise DriverUnavailableError(
                    "PostgreSQL needs psycopg; install it with: pip install 'wfe[postgres]'"
                ) from None
            # no pool_pre_ping: it costs a round trip per checkout (measured: a one-statement
            # transaction 1.8 -> 2.7 ms, reads 0.78 -> 1.35 ms on the 2-core dev box). A dead
            # pooled connection fails its first statement instead; SQLAlchemy flags that
            # (connection_invalidated), drops the pool's older connections, and the retry
            # below runs the transaction again on a fresh one. pool_recycle retires
            # connections before a server or proxy idle timeout can cut them.
            # psycopg in autocommit mode: it sends no BEGIN of its own (a round trip before a
            # transaction's first statement); Database.tx sends BEGIN itself, in the first
            # round trip of the transaction (see _pgbatch), and reads need no toggle
            self.engine = sa.create_engine(
                self.url,
                pool_size=pool_size,
                max_overflow=2,
                pool_pre_ping=False,
                pool_recycle=600,
                isolation_level="AUTOCOMMIT",
                # statements are prepared by _pgbatch (psycopg's own would be deallocated
                # with ours: it sends DEALLOCATE ALL after a rollback)
                connect_args={"prepare_threshold": None},
            )
            workers = pool_size
            # the server processes behind this Database's connections: a worker ignores the
            # NOTIFYs they send (this process wakes its own workers without the round trip)
            event.listen(self.engine, "connect", self._backend_opened)
            event.listen(self.engine, "close", self._backend_closed)
            event.listen(self.engine, "do_execute", _pg_do_execute)
            event.listen(self.engine, "do_executemany", _pg_do_executemany)
            event.listen(self.engine, "do_execute_no_params", _pg_do_execute_no_params)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wfe-db")
        self._going_on: set[asyncio.Task[None]] = set()  # (see _shielded)
        if self.is_postgres:
            from ._pgloop import LoopConnections

            self._loop_conns = LoopConnections(self.engine, self._executor, pool_size // 2 or 1)

    _inline: _Held | None = None
    """SQLite: the connection on which the event loop's thread runs a transaction or a read
    without a thread hop (see :class:`_Held`)."""
    _held: _Held | None = None
    """SQLite: the database thread's connection (checked out once)."""

    _checkpoint_due: bool = False
    """SQLite: a checkpoint is queued on the database thread and has not run yet."""

    def _inline_committed(self, commits: int) -> None:
        """SQLite, after the event loop's connection committed: every
        :data:`CHECKPOINT_EVERY` of its commits, a WAL checkpoint is queued on the database
        thread. The loop's connection never checkpoints itself (``wal_autocheckpoint=0``):
        SQLite's automatic checkpoint runs inside the commit that crosses 1,000 WAL pages and
        copies them to the database file with two fsyncs, a stall of 2-10 ms that the event
        loop (every run in flight, heartbeats, ``wait()``) took about once per 17 runs."""
        if commits % CHECKPOINT_EVERY or self._checkpoint_due:
            return
        self._checkpoint_due = True
        try:
            self._executor.submit(self._checkpoint)
        except RuntimeError:  # (shut down: the last connection to close checkpoints)
            self._checkpoint_due = False

    def _checkpoint(self) -> None:
        """On the database thread: a PASSIVE checkpoint copies the WAL's pages to the
        database file while the loop goes on writing; then a RESTART copies what was
        appended meanwhile and lets the next writer start the WAL again from its beginning
        (a WAL is reused only after a checkpoint that left nothing behind). The RESTART
        holds writers off while it runs, so it waits at most 5 ms for readers (another
        process's long read) and otherwise gives up until the next time."""
        self._checkpoint_due = False
        held = self._held
        if held is None or not held.usable():
            return
        try:
            raw = held.connection().connection.driver_connection
            raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # type: ignore[union-attr]
            raw.execute("PRAGMA busy_timeout=5")  # type: ignore[union-attr]
            try:
                raw.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()  # type: ignore[union-attr]
            finally:
                raw.execute("PRAGMA busy_timeout=30000")  # type: ignore[union-attr]
        except sqlite3.Error as exc:
            if not _sqlite_busy(exc):
                log.warning("SQLite WAL checkpoint failed: %s", exc)
                held.drop()

    _loop_conns: LoopConnections | None = None
    """PostgreSQL: the connections transactions awaited on the event loop run on."""

    own_backends: frozenset[int] = frozenset()
    """PostgreSQL: the backend process ids of this Database's open connections."""

    def _backend_opened(self, dbapi_conn: Any, _record: Any) -> None:
        self.own_backends = self.own_backends | {dbapi_conn.info.backend_pid}

    def _backend_closed(self, dbapi_conn: Any, _record: Any) -> None:
        with contextlib.suppress(Exception):  # (a broken connection may not know it)
            self.own_backends = self.own_backends - {dbapi_conn.info.backend_pid}

    # -- transactions -----------------------------------------------------------------------
    def _unavailable(self, exc: DBAPIError, waited: float | None = None) -> DriverUnavailableError:
        tried = "" if waited is None else f" (retried for {waited:.1f}s)"
        remedy = (
            "that the server runs, that database_url is right and that this host can reach it"
            if self.is_postgres
            else "that database_url names a wfe SQLite file (or a new one) this process may "
            "read and write, and that no other program holds it locked or wrote over it"
        )
        return DriverUnavailableError(
            f"cannot {'reach' if self.is_postgres else 'use'} the database at "
            f"{self.safe_url}{tried}: "
            f"{redact_text(_first_line(exc), self.url)}; check {remedy}"
        )

    def _disk_full(self, exc: DBAPIError) -> DriverUnavailableError:
        where = "the database server's disk" if self.is_postgres else "the database file's disk"
        return DriverUnavailableError(
            f"{where} is full ({self.safe_url}: {redact_text(_first_line(exc), self.url)}): "
            "free disk space there (or move database_url to a larger disk), then retry; "
            "workers go on by themselves once there is room"
        )

    def _denied(self, exc: DBAPIError) -> DriverUnavailableError:
        user = make_url(self.url).username
        who = f"the database user {user!r}" if user else "the database user of database_url"
        return DriverUnavailableError(
            f"{who} may not do what wfe needs at {self.safe_url}: "
            f"{redact_text(_first_line(exc), self.url)}; have the database's owner create "
            "wfe's tables ('wfe db upgrade' with database_url naming the owner) and grant this "
            "user USAGE on their schema and ALL on the tables and sequences in it, or point "
            "database_url at a user who has those privileges"
        )

    def _retry_or_raise(self, exc: DBAPIError, started: float, delay: float) -> float:
        """Whether to try ``exc``'s transaction again: returns the delay to wait first, or
        raises (the error itself, or DriverUnavailableError once the retry budget is spent)."""
        if _is_disk_full(exc):  # (no retry frees space: the caller's storage fault)
            raise self._disk_full(exc) from None
        if _is_denied(exc):
            # (a user who may not create the tables in a database nobody upgraded yet, the
            # default for all but the owner of schema public since PostgreSQL 15, or may not
            # use them: it was raw SQLAlchemy's ProgrammingError, "a bug" to the CLI)
            raise self._denied(exc) from None
        if (isinstance(exc, OperationalError) and _is_config_error(exc)) or _not_sqlite(exc):
            raise self._unavailable(exc) from None
        if not _is_transient(exc):
            raise exc
        waited = time.monotonic() - started
        if waited + delay > self.retry_seconds:
            raise self._unavailable(exc, waited) from None
        self.retries += 1
        if self._outage_since is None and _is_outage(exc):
            self._outage_since = started
            self.outages += 1
            log.warning(
                "the database at %s does not answer (%s); calls are retried for up to %.0fs "
                "(database_retry_seconds), then fail with DriverUnavailableError",
                self.safe_url,
                redact_text(_first_line(exc), self.url),
                self.retry_seconds,
            )
        else:
            log.debug("transient database error, retrying in %.2fs: %s", delay, _first_line(exc))
        return delay

    def _answered(self, seen: int) -> None:
        """A transaction went through during an outage: the outage is over (logged once).
        ``seen``: the outages counted when its attempt began; one begun before this outage was
        noticed proves nothing (its answer was on its way as the server went out of reach:
        ending the outage there logged one outage as two, and counted it twice)."""
        if seen != self.outages:
            return
        since, self._outage_since = self._outage_since, None
        if since is not None:
            log.info(
                "the database at %s answers again, after %.1fs out of reach (%d retries of "
                "transactions in all so far)",
                self.safe_url,
                time.monotonic() - since,
                self.retries,
            )

    def _retrying_sync(self, call: Callable[[_Try], T]) -> T:
        started, delay, attempt = time.monotonic(), _FIRST_DELAY, _Try()
        while True:
            seen = self.outages
            try:
                result = call(attempt)
                if self._outage_since is not None:
                    self._answered(seen)
                return result
            except DBAPIError as exc:
                wait = self._retry_or_raise(exc, started, delay)
            attempt.failed()
            time.sleep(wait)
            delay = min(delay * 2, _MAX_DELAY)

    async def _retrying(
        self, call: Callable[[_Try], T], *, inline_ok: bool = True, turn: bool = True
    ) -> T:
        if self._loop_conns is not None:
            # (shielded: a transaction begun runs to its end, as on a database thread)
            return await _shielded(
                self._retrying_on_loop(self._loop_conns, call), self._going_on, turn=turn
            )
        loop = asyncio.get_running_loop()
        inline = self._inline if inline_ok and self._inline is not None else None
        inline = inline if inline is not None and inline.usable() else None
        started, delay, attempt = time.monotonic(), _FIRST_DELAY, _Try(inline)
        if inline is not None and turn:
            # (a suspension point, as the hop to the thread was; ``turn=False``: the caller
            # suspends, or ends its task, right after, which is that turn: a stage outcome's
            # record, alone in flight, is one turn of the event loop less, as on PostgreSQL)
            await asyncio.sleep(0)
        while True:
            seen = self.outages
            try:
                if attempt.held is inline is not None:
                    try:
                        result = call(attempt)
                    except _WriterBusy:
                        pass  # the database thread waits for the lock
                    else:
                        if self._outage_since is not None:
                            self._answered(seen)
                        return result
                attempt.held = self._held
                result = await loop.run_in_executor(self._executor, call, attempt)
                if self._outage_since is not None:
                    self._answered(seen)
                return result
            except DBAPIError as exc:
                wait = self._retry_or_raise(exc, started, delay)
            attempt.failed()
            await asyncio.sleep(wait)
            delay = min(delay * 2, _MAX_DELAY)

    async def _retrying_on_loop(self, conns: LoopConnections, call: Callable[[_Try], T]) -> T:
        """PostgreSQL: ``call`` in a greenlet on the loop (see ``_pgloop``), retried."""
        started, delay, attempt = time.monotonic(), _FIRST_DELAY, _Try()
        while True:
            conn, usable, seen = None, False, self.outages
            try:
                conn = attempt.conn = await conns.take()
                result = await conns.run(call, attempt)
                usable = True
                if self._outage_since is not None:
                    self._answered(seen)
                return result
            except DBAPIError as exc:
                # a guard's refusal (an outcome's prediction found wrong, a drained workflow's
                # start) is an answer, not a fault: rolled back, the connection is kept (its
                # prepared statements with it)
                usable = refused(exc)
                wait = self._retry_or_raise(exc, started, delay)
            except Exception:
                usable = True  # (an error of the function's own: rolled back)
                raise
            finally:
                attempt.conn = None
                if conn is not None:
                    conns.give(conn, usable=usable)
            attempt.failed()
            await asyncio.sleep(wait)
            delay = min(delay * 2, _MAX_DELAY)

    def _tx_once(
        self,
        attempt: _Try,
        fn: Callable[Concatenate[Connection, P], T],
        *a: P.args,
        **k: P.kwargs,
    ) -> T:
        attempt.committing = False
        token = _COMMIT_UNKNOWN.set(attempt.commit_unknown)
        info: dict[Any, Any] = {}
        try:
            if attempt.held is not None and attempt.held.usable():
                return attempt.held.tx(attempt, fn, *a, **k)
            with self._begin(attempt) as conn:
                if self.is_postgres:
                    info = conn.info
                    info[_TX] = []  # a transaction: writes may be deferred (see defer())
                    info[_TRY] = attempt  # (commit_with_next marks it committing)
                result = fn(conn, *a, **k)
                attempt.committing = True  # leaving the block commits
                if conn.info.get(_TX):
                    # deferred writes go out with the COMMIT: one round trip (the commit
                    # SQLAlchemy sends next is then a no-op in psycopg)
                    _commit(conn)
            return result
        finally:
            info.pop(_TX, None)  # (the pooled connection's info outlives this transaction)
            info.pop(_DEFER, None)
            info.pop(_TRY, None)
            info.pop(_LAST, None)
            info.pop(_SPEC, None)
            _COMMIT_UNKNOWN.reset(token)

    @contextlib.contextmanager
    def _begin(self, attempt: _Try) -> Iterator[Connection]:
        conn = attempt.conn
        if conn is None:
            with self.engine.begin() as pooled:
                yield pooled
        else:
            with conn.begin():
                yield conn

    def _read_once(
        self,
        _attempt: _Try,
        fn: Callable[Concatenate[Connection, P], T],
        *a: P.args,
        **k: P.kwargs,
    ) -> T:
        if _attempt.held is not None and _attempt.held.usable():
            return _attempt.held.read(_attempt, fn, *a, **k)
        if _attempt.conn is not None:
            conn = _attempt.conn
            try:
                return fn(conn, *a, **k)
            finally:
                conn.rollback()  # (ends SQLAlchemy's autobegun transaction: no SQL)
        with self.engine.connect() as raw:
            # (PostgreSQL connections are in autocommit mode already)
            conn = raw if self.is_postgres else raw.execution_options(isolation_level="AUTOCOMMIT")
            return fn(conn, *a, **k)

    def tx_sync(self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs) -> T:
        """Run ``fn(conn, ...)`` in one transaction, on the calling thread (retried on
        transient connection errors, see the module docstring)."""
        return self._retrying_sync(lambda attempt: self._tx_once(attempt, fn, *a, **k))

    def read_sync(
        self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs
    ) -> T:
        """Run read-only ``fn(conn, ...)`` in autocommit: one round trip per query, no
        BEGIN/COMMIT, and on SQLite no write lock."""
        return self._retrying_sync(lambda attempt: self._read_once(attempt, fn, *a, **k))

    async def read(
        self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs
    ) -> T:
        return await self._retrying(lambda attempt: self._read_once(attempt, fn, *a, **k))

    async def read_long(
        self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs
    ) -> T:
        """:meth:`read` for a read whose time grows with a table (a count of every pending
        event for a gauge): on SQLite it runs on the database thread, never on the event
        loop's inline connection, so the loop (heartbeats, claims, ``wait()``) does not stall
        while it counts. On PostgreSQL the same as :meth:`read` (its waits yield the loop)."""
        return await self._retrying(
            lambda attempt: self._read_once(attempt, fn, *a, **k), inline_ok=False
        )

    async def tx_long(
        self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs
    ) -> T:
        """:meth:`tx` for a transaction that may read a lot before it writes (an outbox flush
        looking past the events that wait for a retry): on SQLite on the database thread,
        never inline on the event loop (see :meth:`read_long`)."""
        return await self._retrying(
            lambda attempt: self._tx_once(attempt, fn, *a, **k), inline_ok=False
        )

    async def tx(self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs) -> T:
        """Run ``fn(conn, ...)`` in one transaction on the database thread pool (retried on
        transient connection errors, see the module docstring)."""
        return await self._retrying(lambda attempt: self._tx_once(attempt, fn, *a, **k))

    async def tx_then_yield(
        self, fn: Callable[Concatenate[Connection, P], T], *a: P.args, **k: P.kwargs
    ) -> T:
        """:meth:`tx` for a caller that suspends, or ends its task, right after it (a stage
        outcome's record): on PostgreSQL a transaction answered within its blocking poll
        returns without the loop turn :meth:`tx` takes after it, and on SQLite an inline
        transaction runs without the turn :meth:`tx` takes before it (the caller's own
        suspension is that turn: one turn of the event loop less on a stage's way to the
        next)."""
        return await self._retrying(lambda attempt: self._tx_once(attempt, fn, *a, **k), turn=False)

    @property
    def safe_url(self) -> str:
        return redact_url(self.url)

    # -- schema -----------------------------------------------------------------------------
    def upgrade(self) -> list[int]:
        """Bring the schema up to this code's version; a database a newer wfe wrote (a
        schema version this code does not know) is refused, not used."""

        def run(conn: Connection) -> list[int]:
            if self.is_postgres:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(724401)"))
            self.check_not_newer(_schema.schema_version(conn))
            return _schema.upgrade(conn)

        return self.tx_sync(run)

    def check_not_newer(self, version: int) -> None:
        latest = _schema.LATEST_SCHEMA_VERSION
        if version > latest:
            raise DriverUnavailableError(
                f"the database at {self.safe_url} is at schema version {version}, which a newer "
                f"wfe wrote (this one knows up to {latest}); upgrade wfe on this host (every "
                "worker and the CLI need the same or a newer version)"
            )

    def schema_version(self) -> int:
        return self.tx_sync(_schema.schema_version)

    def schema_status(self) -> tuple[int, int]:
        """(the database's schema version, the version this code needs); reads only."""
        return self.read_sync(_schema.schema_version), _schema.LATEST_SCHEMA_VERSION

    async def settle(self, timeout: float) -> None:
        """Let the transactions whose callers are gone end (PostgreSQL: they run in tasks of
        their own, see :func:`_shielded`), up to ``timeout``, then cancel the rest (rolled
        back): called before :meth:`dispose`, so a closed engine has nothing of its database
        still running on the loop (a closed engine left a heartbeat's transaction behind it,
        with the greenlet it ran in and the connection)."""
        going_on = set(self._going_on)
        if not going_on:
            return
        _done, late = await asyncio.wait(going_on, timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    def dispose(self) -> None:
        # (SQLAlchemy's PostgreSQL dialect stays in its reflection caches for a while: not
        # the statements compiled for it)
        self.engine.dialect.__dict__.pop(PREPARED, None)
        self._executor.shutdown(wait=True)
        if self._loop_conns is not None:
            self._loop_conns.close()
        for held in (self._inline, self._held):
            if held is not None:
                held.drop()
        self.engine.dispose()


PREPARED = "_wfe_prepared"
"""The attribute of a dialect holding the statements ``_rawsql`` compiled for it."""
_TX = "wfe_tail"
"""``conn.info`` key, set while a PostgreSQL transaction function runs: the writes it deferred
(SQL and parameters as SQLAlchemy compiled them), not sent yet."""
_DEFER = "wfe_defer"
"""``conn.info`` key: the statement being executed now is a deferred write."""
_TRY = "wfe_try"
"""``conn.info`` key, set while a PostgreSQL transaction function runs: its ``_Try``."""
_LAST = "wfe_last"
"""``conn.info`` key: the next statements sent together end the transaction (COMMIT)."""
_SHARED = "wfe_shared"
"""``conn.info`` key: the function running shares its transaction with others."""
_SPEC = "wfe_speculating"
"""``conn.info`` key: the function running works from predicted reads (see
:func:`speculating`): every statement must be deferred."""


class Unpredicted(Exception):
    """Inside :func:`speculating`: a statement had to be sent before the COMMIT (a read the
    prediction did not cover), or a predicted row was asked for a field it does not hold.
    Nothing was sent: the caller drops what it deferred and takes its slow path."""


@contextlib.contextmanager
def speculating(conn: Connection) -> Iterator[None]:
    """PostgreSQL, inside :meth:`Database.tx`: the statements issued inside are all deferred
    (they go out with the COMMIT, behind a guard the caller deferred first); one that would
    be sent now raises :class:`Unpredicted` instead, before anything goes out."""
    info = conn.info
    info[_SPEC] = True
    try:
        yield
    finally:
        info.pop(_SPEC, None)


def deferred(conn: Connection) -> list[Any] | None:
    """PostgreSQL, inside :meth:`Database.tx`: the writes deferred so far (a list the caller
    may cut back to an earlier length); None elsewhere."""
    tail: list[Any] | None = conn.info.get(_TX)
    return tail


def commit_with_next(conn: Connection) -> None:
    """Inside :meth:`Database.tx` on PostgreSQL: the next statements sent together
    (``send_together``, e.g. ``_rawsql.execute_together``) are the transaction's last reads,
    and its COMMIT goes out with them (one round trip less than reading, then committing).
    The transaction function must write nothing after them; a read after them runs on its
    own, in autocommit. Elsewhere a no-op."""
    info = conn.info
    if info.get(_TX) is not None and not info.get(_SHARED):
        info[_LAST] = True


@contextlib.contextmanager
def shared(conn: Connection) -> Iterator[None]:
    """Around one of several functions run in one transaction (group commit): none of them
    ends it (:func:`commit_with_next` is a no-op inside)."""
    conn.info[_SHARED] = True
    try:
        yield
    finally:
        conn.info.pop(_SHARED, None)


def defer(conn: Connection, statement: Any, params: Any = None) -> None:
    """Execute a write whose result nobody reads (no RETURNING, no row count), possibly later.

    On PostgreSQL, inside :meth:`Database.tx`, the write is held back and sent in one
    multi-statement query (one network round trip, see ``_pgbatch``) with the next statement
    that needs its result, or with the COMMIT. The server still runs every statement in the order
    the transaction function issued them, so what each statement sees is unchanged; an error
    of a deferred write surfaces at that next statement or at the commit, inside the same
    transaction (wrapped by SQLAlchemy as usual). Elsewhere it is ``conn.execute``."""
    info = conn.info
    if _TX not in info:
        conn.execute(statement, params)
        return
    info[_DEFER] = True
    try:
        conn.execute(statement, params)
    finally:
        info[_DEFER] = False


def _returns(context: Any) -> bool:
    """The statement has a RETURNING SQLAlchemy will read (e.g. the generated primary key of
    a single-row insert): it cannot be held back."""
    return bool(getattr(context.compiled, "effective_returning", None))


def _pg_do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
    return _pg_send(cursor, statement, parameters, context, many=False)


def _pg_do_executemany(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
    return _pg_send(cursor, statement, parameters, context, many=True)


def _pg_do_execute_no_params(cursor: Any, statement: str, context: Any) -> bool:
    return _pg_send(cursor, statement, None, context, many=False)


def _pg_send(cursor: Any, statement: str, parameters: Any, context: Any, *, many: bool) -> bool:
    """SQLAlchemy's ``do_execute`` hook on PostgreSQL: queue a deferred write, or send the
    statement (with the queued writes and BEGIN when due) through :func:`_send`. Returns
    False to let SQLAlchemy execute the statement itself."""
    try:
        info = context.root_connection.info
    except NotImplementedError:  # SQLAlchemy's first-connect probe: no pooled connection
        return False
    tail: list[tuple[str, Any, bool]] | None = info.get(_TX)
    if tail is not None and info.get(_DEFER) and not _returns(context):
        tail.append((statement, parameters, many))
        return True
    return _send(cursor, info, tail, statement, parameters, many=many)


def _send(
    cursor: Any,
    info: dict[Any, Any],
    tail: list[tuple[str, Any, bool]] | None,
    statement: str,
    parameters: Any,
    *,
    many: bool,
) -> bool:
    """PostgreSQL: send a statement through :func:`_pgbatch.send_batch` (inside a
    :meth:`Database.tx`, with the transaction's deferred writes and BEGIN when due: one round
    trip). Returns False for an executemany with nothing to send before it (the caller
    executes it)."""
    if info.get(_SPEC):
        raise Unpredicted(statement)
    if not many:
        send_batch(cursor, info, tail, [(statement, parameters)])
        return True
    from psycopg.pq import TransactionStatus

    if tail is None or (
        not tail and cursor.connection.info.transaction_status != TransactionStatus.IDLE
    ):
        return False
    # (psycopg reports an executemany's row count summed over its parameter sets: it runs
    # on its own, after the rest)
    send_batch(cursor, info, tail, [])
    cursor.executemany(statement, parameters)
    return True


def _commit(conn: Connection) -> None:
    """PostgreSQL, inside :meth:`Database.tx`: the deferred writes and COMMIT in one round
    trip, on the DBAPI cursor (as ``_rawsql`` sends statements; SQLAlchemy's execute path, a
    cursor made and closed and a result object, cost more client CPU than sending them), with
    nothing of the result read. ``before_cursor_execute`` listeners see the COMMIT and a
    DBAPI error is handled and wrapped by SQLAlchemy, as with ``exec_driver_sql``."""
    statement, cursor, info = "COMMIT", None, conn.info
    try:
        if conn._has_events or conn.engine._has_events:
            for fn in conn.dispatch.before_cursor_execute:
                fn(conn, None, statement, None, None, False)
        cursor = cursors(conn, 1)[0]
        tail = info[_TX]
        info[_TX] = None  # (committed: nothing is deferred or wrapped in BEGIN after it)
        send_commit(cursor, info, tail)
    except Exception as exc:
        forget_cursors(conn)
        conn._handle_dbapi_exception(exc, statement, None, cursor, None)
        raise  # (not reached: SQLAlchemy raises its wrapped error)


_CURSORS = "wfe_cursors"
"""``conn.info`` key: the DBAPI connection and the cursors :func:`cursors` keeps on it."""


def cursors(conn: Connection, n: int) -> list[Any]:
    """``n`` cursors on ``conn``'s DBAPI connection, made once per connection and reused by
    every statement (making and closing them per statement cost more client CPU than most
    statements' own work: bench/README.md, 2026-12-01 late). Each caller reads all its
    results before it returns, so no two calls share a cursor's result."""
    pooled = conn.connection  # (``conn.info`` is its info: one property walk, not three)
    raw: Any = pooled.driver_connection
    info = pooled.info
    held = info.get(_CURSORS)
    if held is None or held[0] is not raw:
        held = info[_CURSORS] = (raw, [])
    have: list[Any] = held[1]
    while len(have) < n:
        have.append(raw.cursor())
    return have[:n]


def forget_cursors(conn: Connection) -> None:
    """After an error: the cursors are not used again (the next statement makes new ones)."""
    held = conn.info.pop(_CURSORS, None)
    for cursor in held[1] if held is not None else ():
        with contextlib.suppress(Exception):
            cursor.close()


def queue_later(conn: Connection, statement: str, parameters: Any, *, many: bool) -> bool:
    """:func:`send_raw` of a write ``later`` when it is queued (inside a PostgreSQL
    :meth:`Database.tx`): True, queued, with no cursor needed; False: it is to be sent."""
    if conn.dialect.name == "postgresql":
        tail: list[tuple[str, Any, bool]] | None = conn.info.get(_TX)
        if tail is not None:
            tail.append((statement, parameters, many))
            return True
    return False


def send_raw(
    conn: Connection, cursor: Any, statement: str, parameters: Any, *, later: bool, many: bool
) -> bool:
    """Execute a statement on the DBAPI ``cursor`` of ``conn`` (``_rawsql``): with ``later``,
    inside a PostgreSQL :meth:`Database.tx`, queue it with the deferred writes instead
    (returns False: there is no result to read); otherwise send it (on PostgreSQL with the
    deferred writes, in one round trip: see :func:`defer`)."""
    if conn.dialect.name == "postgresql":
        tail: list[tuple[str, Any, bool]] | None = conn.info.get(_TX)
        if tail is not None and later:
            tail.append((statement, parameters, many))
            return False
        if _send(cursor, conn.info, tail, statement, parameters, many=many):
            return True
    if many:
        cursor.executemany(statement, parameters)
    else:
        cursor.execute(statement, parameters)
    return True


def send_together(conn: Connection, calls: list[tuple[Any, str, Any]]) -> Iterator[Any]:
    """Execute statements whose results the caller reads after all of them ran (``calls``:
    cursor, SQL, parameters), in order; yields, for each, a cursor on its result. On
    PostgreSQL they go out in one round trip (inside a :meth:`Database.tx` with the
    transaction's deferred writes before them), on the first call's cursor, stepped from one
    result to the next; on SQLite each runs on its own cursor."""
    if conn.dialect.name != "postgresql":
        for cursor, statement, parameters in calls:
            cursor.execute(statement, parameters)
        for cursor, _, _ in calls:
            yield cursor
        return
    cursor, info = calls[0][0], conn.info
    if info.get(_SPEC):
        raise Unpredicted(calls[0][1])
    batch = [(sql, p) for _, sql, p in calls]
    if info.pop(_LAST, False):
        batch.append(("COMMIT", None))
        info[_TRY].committing = True  # (a failure now may have committed)
        tail = info[_TX]
        info[_TX] = None  # (committed: nothing is deferred or wrapped in BEGIN after it)
        send_batch(cursor, info, tail, batch)
    else:
        send_batch(cursor, info, info.get(_TX), batch)
    for i in range(len(calls)):
        if i:
            cursor.nextset()
        yield cursor


REFUSED = "22012"
"""The SQLSTATE of a guard statement refusing a transaction (a division by zero: an
outcome's prediction found wrong, ``_progress``; a drained workflow's start, ``_runs``)."""


def refused(exc: DBAPIError) -> bool:
    """The transaction failed on a guard statement (and was rolled back): not a fault."""
    return not exc.connection_invalidated and getattr(exc.orig, "sqlstate", None) == REFUSED


def _first_line(exc: DBAPIError) -> str:
    """The driver's own message, first line only: SQLAlchemy's message goes on with the SQL
    text and its parameters (user data), which never go into an error a user sees."""
    text = str(exc.orig).strip().splitlines()
    return text[0] if text else type(exc.orig).__name__


_CONFIG_ERRORS = (
    "does not exist",
    "unable to open database",
    "password authentication failed",
    "no pg_hba.conf entry",
    "could not translate host name",
    "no such host",
    "name or service not known",
)


def _is_config_error(exc: DBAPIError) -> bool:
    """The database cannot be used as configured (a wrong name, user, password or host): no
    retry will help."""
    text = str(exc.orig).lower()
    return any(s in text for s in _CONFIG_ERRORS)


def _not_sqlite(exc: DBAPIError) -> bool:
    """SQLite: the file is not a database, or a corrupt one (no retry will help)."""
    text = str(exc.orig)
    return type(exc.orig).__module__.startswith("sqlite3") and (
        "file is not a database" in text or "database disk image is malformed" in text
    )


_SQLITE_FULL = 13  # "database or disk is full" (the primary result code)
_PG_DISK_FULL = "53100"  # disk_full ("could not extend file ...: No space left on device")


def _is_disk_full(exc: DBAPIError) -> bool:
    """The disk under the database is full: SQLite's SQLITE_FULL, PostgreSQL's disk_full."""
    orig = exc.orig
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:
        return True
    return getattr(orig, "sqlstate", None) == _PG_DISK_FULL


_PG_DENIED = "42501"  # insufficient_privilege ("permission denied for schema public")


def _is_denied(exc: DBAPIError) -> bool:
    """PostgreSQL refused the statement to this user: no retry will help."""
    return getattr(exc.orig, "sqlstate", None) == _PG_DENIED


def _is_outage(exc: DBAPIError) -> bool:
    """A transient error that means the database is out of reach (a connection dropped,
    refused or terminated, a server shutting down), not a conflict between transactions (a
    serialisation failure, a deadlock, SQLite's lock), which busy workers meet routinely."""
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    if not type(orig).__module__.startswith("psycopg"):
        return False
    state = getattr(orig, "sqlstate", None)
    return state is None or state[:2] in ("08", "57", "53")


def _is_transient(exc: DBAPIError) -> bool:
    """A connection dropped, refused or timed out, a server shutting down, a serialisation
    failure or deadlock, or SQLite still locked after its busy timeout: the transaction did
    not commit (or its commit was not acknowledged) and may be run again."""
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    module = type(orig).__module__
    if module.startswith("psycopg"):
        import psycopg

        if isinstance(orig, psycopg.errors.QueryCanceled):
            return False  # a statement timeout: running it again would time out again
        return isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError)
    if module.startswith("sqlite3"):
        text = str(orig).lower()
        return "database is locked" in text or "database is busy" in text
    return False


def _sqlite_json(value: Any) -> str | bytes:
    """The stored form of a JSON column's value on SQLite. A column declared ``JSON`` has
    NUMERIC affinity there, so SQLite turns text that reads as a number into an INTEGER or a
    REAL: a stage output of ``10**30`` came back as ``1e+30`` and ``-0.0`` as ``0``. A JSON
    number (the only JSON text that starts with ``-`` or a digit) is stored as a BLOB of the
    same text instead, which SQLite keeps byte for byte and ``json.loads`` reads back; every
    other value stays text. Rows written before keep what SQLite made of them."""
    text = json.dumps(value)
    if text[:1] in _NUMBER_START:
        return text.encode()
    return text


_NUMBER_START = frozenset("-0123456789")


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


class _Held:
    """SQLite: a connection held (checked out once) by one thread, on which transactions
    begin with a raw ``BEGIN IMMEDIATE`` (no pool checkout, return and reset per
    transaction). Only the first thread that uses it does; any error other than a busy
    database drops the connection (the next call opens a fresh one).

    Two of them per :class:`Database`: the database thread's, and (``inline``) the event
    loop's, on which a transaction or an autocommit read runs without the hop to the
    database thread (a hop costs ~0.1 ms of CPU, more than a small transaction itself). The
    loop never waits for the database: the inline connection's busy_timeout is 0, so when
    another writer holds the lock (this process's database thread, another process) its
    BEGIN IMMEDIATE fails at once, before the transaction function ran, and the call goes to
    the database thread, which waits for the lock there (:class:`_WriterBusy`)."""

    def __init__(
        self, engine: Engine, *, inline: bool, on_commit: Callable[[int], None] | None = None
    ) -> None:
        self.engine = engine
        self.inline = inline
        self.on_commit = on_commit
        self.commits = 0
        self.conn: Connection | None = None
        self.thread: int | None = None

    def usable(self) -> bool:
        ident = threading.get_ident()
        if self.thread is None:
            self.thread = ident
        return self.thread == ident

    def connection(self) -> Connection:
        if self.conn is None:
            conn = self.engine.connect()
            if self.inline:
                raw = conn.connection.driver_connection
                raw.execute("PRAGMA busy_timeout=0")  # type: ignore[union-attr]
                raw.execute("PRAGMA wal_autocheckpoint=0")  # type: ignore[union-attr]
            self.conn = conn
        return self.conn

    def drop(self) -> None:
        """Close the connection for good (it never goes back to the pool: the inline one's
        busy_timeout is 0)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
                conn.close()

    def tx(
        self,
        attempt: _Try,
        fn: Callable[Concatenate[Connection, P], T],
        *a: P.args,
        **k: P.kwargs,
    ) -> T:
        conn = self.connection()
        if conn._has_events or conn.engine._has_events:  # (statement counters see it)
            for listen in conn.dispatch.before_cursor_execute:
                listen(conn, None, "BEGIN IMMEDIATE", (), None, False)
        try:
            conn.connection.driver_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
        except sqlite3.Error as exc:
            if not _sqlite_busy(exc):
                self.drop()
            if self.inline:
                raise _WriterBusy from None  # (the database thread's try reports real errors)
            raise OperationalError("BEGIN IMMEDIATE", None, exc) from None  # (retried if busy)
        info = conn.info
        info[_BEGUN] = True  # SQLAlchemy's begin below sends no second BEGIN
        try:
            with conn.begin():
                result = fn(conn, *a, **k)
                attempt.committing = True  # leaving the block commits
        except DBAPIError as exc:
            self._failed(attempt, exc)
            raise
        except BaseException:
            if conn.in_transaction():  # (its rollback failed)
                self.drop()
            raise
        finally:
            info.pop(_BEGUN, None)
        if self.on_commit is not None:
            self.commits += 1
            self.on_commit(self.commits)
        return result

    def read(
        self,
        attempt: _Try,
        fn: Callable[Concatenate[Connection, P], T],
        *a: P.args,
        **k: P.kwargs,
    ) -> T:
        conn = self.connection()
        info = conn.info
        info[_BEGUN] = True  # autocommit: SQLAlchemy's autobegin sends no BEGIN
        try:
            return fn(conn, *a, **k)
        except DBAPIError as exc:
            self._failed(attempt, exc)
            raise
        finally:
            info.pop(_BEGUN, None)
            if self.conn is conn:
                # end SQLAlchemy's autobegun transaction (no SQL), also when fn raised:
                # the next begin() on this connection would refuse otherwise
                try:
                    conn.rollback()
                except Exception:
                    self.drop()
                    raise

    def _failed(self, attempt: _Try, exc: DBAPIError) -> None:
        """A database error on the held connection: the database busy keeps the connection
        (and, inline, before anything was committed, goes to the database thread at once);
        anything else drops it. Then the usual retry path."""
        if (
            not exc.connection_invalidated
            and isinstance(exc.orig, sqlite3.OperationalError)
            and _sqlite_busy(exc.orig)
        ):
            with contextlib.suppress(Exception):
                if self.conn is not None:
                    self.conn.rollback()
            if self.inline and not attempt.committing:
                raise _WriterBusy from exc
            return
        self.drop()


CHECKPOINT_EVERY = 64
"""SQLite: the event loop's commits between two WAL checkpoints on the database thread (a
3-stage run commits 4 times and writes ~58 WAL pages: ~900 pages, SQLite's own default being
1,000)."""

_BEGUN = "wfe_begun"
"""``conn.info`` key (SQLite, :class:`_Held`): the transaction is begun (or autocommit);
the ``begin`` listener sends no BEGIN."""


def _sqlite_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text


def _sqlite_on_begin(conn: Connection) -> None:
    if conn.info.get(_BEGUN):
        return
    if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
