"""The long-running worker host: claims jobs, executes them with heartbeats, and drives the
kernel's maintenance (reap leases, flush the outbox, reap stuck runs, retention)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from sqlalchemy.engine import make_url

from engine_port.driver import describe_fault, is_storage_fault, redact_text

from ._commands import (
    SKIPPED,
    ClaimPending,
    ExecuteJob,
    FlushOutbox,
    PurgeRuns,
    ReapStaleLeases,
    ReapStuckRuns,
    ReleaseJobs,
)
from ._dbclock import DatabaseClock
from ._jobs import AHEAD, CHANNEL, notify_ahead
from ._kernel import Kernel
from ._outbox import OutboxCounts, count_outbox

__all__ = ["COUNTERS", "JOB_RESULTS", "WorkerHost"]

log = logging.getLogger("wfe.worker")


_SURVEY_SHARE = 0.02
"""The most of the time a worker spends on the whole-table parts of its maintenance."""

_SURVEY_MAX_GAP = 5.0
"""The longest a worker goes between surveys however long the last one took: the survey
also fails runs past their run timeout, which must not wait for minutes because one look
was slow (its time counts the waits for a database thread on a busy host, not only work)."""


_IDLE_FLUSH_SHARE = 0.1
"""The most of the time a worker spends on flushes that find every event waiting for a retry."""

_LISTEN_MAX_DELAY = 4.0
"""The longest pause between two attempts to open the LISTEN connection again (the delay
doubles from 0.5 s): it is back within that of the server's return."""

_FLUSH_WAIT_S = 0.5
"""How long the loop waits for the outbox flush it started before it goes on without it (the
flush then goes on beside the loop): a slow or hanging event sink (the user's code, each
publish bounded by its timeout) holds claims at most this long per flush. Not 0: with a sink
that answers, the loop keeps the order it had while it ran the flush itself (claim, flush,
maintenance). Not waiting made the reap of expired leases follow the claim at once; that
exposed a race of the reap with the start of a compensation job (fixed in
``_progress.begin_compensation_job``), and such timing is better not changed in passing."""

_TIMERS_KEPT = 1024
"""The most due times a worker keeps to wake itself at (the earliest ones): a job due later
than all of them is found by the poll, as a timer of another process is."""

_TIMER_RETRY_S = 0.0005
"""How long after a timer that rang before its time by the engine's clock (the event loop's
clock and the wall clock are not the same clock) it rings again at the least; doubled at
each early ring in a row (a clock that does not move, a test's ``FakeClock``, must not make
it ring every half millisecond), up to the poll interval."""

_FINAL_FLUSH_MIN_S = 1.0
"""The least time the final flush of a stop gets (a stop whose stages took all of its
``shutdown_timeout`` still delivers what it can quickly)."""

JOB_RESULTS = (
    "completed",
    "suspended",
    "retrying",
    "failed",
    "cancelled",
    "compensated",
    "deferred",
    "discarded",
    "abandoned",
    "skipped",
)
"""What a job this worker ran came to, each counted in :meth:`WorkerHost.stats`: a stage
attempt ``completed``, ``suspended``, ``retrying`` (failed, a retry is due), ``failed`` (for
good) or ``cancelled``; a compensation job ``compensated`` (or ``deferred``: not its turn yet);
``discarded`` (the lease was lost: another claim owns the job), ``abandoned`` (the engine's
storage failed: due again after a backoff), ``skipped`` (nothing left to do when begun)."""

COUNTERS = (
    *JOB_RESULTS,
    "claimed",
    "handed_off",
    "released",
    "leases_returned",
    "reaped_leases",
    "reaped_runs",
    "purged",
    "dead_lettered",
    "engine_errors",
    "loop_errors",
    "listen_errors",
    "woken_by_notify",
    "woken_by_poll",
    "woken_by_timer",
)
"""Every counter :meth:`WorkerHost.stats` reports, each 0 until it counts something."""


class WorkerHost:
    """``async with WorkerHost(kernel): ...`` runs a worker in this process."""

    def __init__(
        self,
        kernel: Kernel,
        *,
        worker_id: str | None = None,
        concurrency: int | None = None,
        poll_interval: float | None = None,
        maintenance_interval: float = 1.0,
        flush_interval: float = 0.05,
        retention_seconds: float | None = None,
        shutdown_timeout: float = 10.0,
        served: frozenset[str] | None = None,
        on_job_done: Callable[[str], None] | None = None,
        listen: bool | None = None,
    ) -> None:
        """``listen`` (default: on PostgreSQL): a LISTEN connection wakes this worker when a
        transaction of another process makes a job due, instead of waiting for the next poll
        (``poll_interval``, which stays as the safety net)."""
        self.kernel = kernel
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.concurrency = concurrency or kernel.settings.worker_concurrency
        self.poll_interval = poll_interval or kernel.settings.poll_interval_seconds
        self.maintenance_interval = maintenance_interval
        self.flush_interval = flush_interval
        # seconds; None: the ``retention`` setting (off unless set)
        self.retention_seconds = (
            retention_seconds if retention_seconds is not None else kernel.settings.retention
        )
        self.shutdown_timeout = shutdown_timeout
        self.served = served
        self.on_job_done = on_job_done
        self.listen = kernel.db.is_postgres if listen is None else listen
        self._listen_task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()  # set while the LISTEN connection is up
        self._active: dict[int, tuple[Any, asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._counts: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        self._started_at = 0.0
        self.last_flush: Any = None
        self._outbox = OutboxCounts()
        self._surveying: asyncio.Task[None] | None = None  # ``_survey`` under way
        # the outbox flush under way: beside the loop, so a slow or hanging event sink (the
        # user's code) never holds up claiming and running stages
        self._flushing: asyncio.Task[None] | None = None
        self._next_flush = 0.0  # (monotonic) when the next flush starts
        self._next_survey = 0.0  # (monotonic) when ``_survey`` runs next
        self._away_since: float | None = None  # (monotonic) the database stopped answering
        # when jobs this worker ran are due again (the kernel's clock, epoch seconds), each
        # with the number of its report (sorted, at most _TIMERS_KEPT), and the one timer of
        # the event loop set for the earliest
        self._due_times: list[tuple[float, int]] = []
        self._reports = 0  # due times reported so far
        # (the kernel's clock, reports) when the last claim began to look: a time it saw due,
        # reported before it looked, needs no wake-up of its own
        self._looked: tuple[float, int] = (0.0, 0)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # the due time it is set for
        # the due times kept that a look for work learned (their report numbers): the
        # earliest a claim would take, whoever recorded it (a worker that stopped, another
        # process); when one comes, the times after it are not known: the next idle pass looks
        self._learned: set[int] = set()
        # whether every time to come that the last look saw is kept (a look that found a
        # job due now told none); False: look (one read) before the loop pauses
        self._ahead_known = False
        # it stops leaving jobs due later that it would have woken itself for (``stop``)
        self._left_due = False
        self._early_s = 0.0  # the last wait after a ring that came before its time

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        # (before anything is claimed: a definition changed under its version is refused)
        await self.kernel.check_definitions()
        self._started_at = time.monotonic()
        self._loop_task = asyncio.create_task(self._loop(), name=f"wfe-worker-{self.worker_id}")
        if self.listen and self.kernel.db.is_postgres:
            self._listen_task = asyncio.create_task(
                self._listen(), name=f"wfe-listen-{self.worker_id}"
            )

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Graceful: stop claiming, let running jobs finish (up to ``shutdown_timeout``), then
        cancel the rest and give their leases back so another worker takes them at once."""
        self._stopping = True
        self._wake.set()
        self._left_due |= bool(self._due_times)
        self._drop_timer()
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listen_task
            self._listen_task = None
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._surveying is not None:
            self._surveying.cancel()
            await asyncio.gather(self._surveying, return_exceptions=True)
            self._surveying = None
        # (the flush under way, if any, goes on meanwhile, within the same time)
        stop_by = time.monotonic() + self.shutdown_timeout
        tasks = [t for _, t in self._active.values()]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=self.shutdown_timeout)
            held = [job for job, t in list(self._active.values()) if t in pending]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if held:
                ids = tuple(int(job.id) for job in held)
                tokens = tuple(int(job.lease_token) for job in held)
                await self.kernel.dispatch(ReleaseJobs(ids, self.worker_id, tokens))
                self._counts["released"] += len(ids)
                # the runner logged each as "stage cancelled": say it was this shutdown
                log.info(
                    "worker %s: stopped %d stage attempt(s) still running after "
                    "shutdown_timeout=%gs and gave their leases back; they run again on "
                    "another worker, attempt kept, journaled steps not run again (runs: %s)",
                    self.worker_id,
                    len(ids),
                    self.shutdown_timeout,
                    _some(sorted({str(job.run_id) for job in held})),
                )
        if self._left_due and self.kernel.db.is_postgres:
            # the jobs this worker would have woken itself for (a sleep recorded after another
            # worker's last look: a rolling deploy) come due on time there (one NOTIFY)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.kernel.db.tx(notify_ahead), _FINAL_FLUSH_MIN_S)
        if await self._end_flush(max(stop_by - time.monotonic(), 0.0)):
            # the events of the last stages, bounded: a sink that hangs cannot hold the stop
            # (what is left waits in the outbox for the next worker)
            with contextlib.suppress(Exception):
                left = max(stop_by - time.monotonic(), _FINAL_FLUSH_MIN_S)
                await asyncio.wait_for(self.kernel.dispatch(FlushOutbox()), left)

    async def _end_flush(self, timeout: float) -> bool:
        """Let the flush under way finish (up to ``timeout``), else cancel it (its events are
        delivered again later: at least once); whether it finished."""
        task, self._flushing = self._flushing, None
        if task is None or task.done():
            return True
        _done, pending = await asyncio.wait({task}, timeout=timeout)
        if pending:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            log.warning(
                "worker %s: the outbox flush under way (a slow event sink?) had not ended "
                "within shutdown_timeout=%gs; stopped it, its events are delivered later",
                self.worker_id,
                self.shutdown_timeout,
            )
            return False
        return True

    async def run_forever(self) -> None:
        await self.start()
        try:
            assert self._loop_task is not None
            await asyncio.shield(self._loop_task)
        finally:
            await self.stop()

    def stats(self) -> dict[str, Any]:
        """What this worker is and did. Every key is there from the start (a counter is 0
        until it counts something):

        - ``worker_id``, ``running`` (jobs under way now), ``uptime_s``;
        - the outbox as last seen (refreshed every ``maintenance_interval``, less often when
          counting takes long: ``_survey``): ``outbox_pending`` (not failed yet),
          ``outbox_retrying`` (the sink failed; waiting for a retry with backoff),
          ``outbox_dead`` (dead-lettered, waiting for ``replay_dlq()``);
        - what the jobs it ran came to (:data:`JOB_RESULTS`): ``completed``, ``suspended``,
          ``retrying``, ``failed``, ``cancelled``, ``compensated``, ``deferred``,
          ``discarded``, ``abandoned``, ``skipped``;
        - counters of its loop (:data:`COUNTERS`): ``claimed`` (jobs taken from the queue),
          ``handed_off`` (stages handed to it straight from a transition), ``released``
          (leases given back at shutdown), ``leases_returned`` (leases of attempts abandoned
          during a database outage, given back after it), ``reaped_leases`` (jobs taken over
          from an expired lease), ``reaped_runs`` (runs past their timeout, or that lost their
          jobs, dealt with), ``purged`` (runs deleted by retention), ``dead_lettered`` (events
          this worker gave up), ``engine_errors`` (jobs that failed in the engine, logged with
          a traceback), ``loop_errors``, ``listen_errors``, ``woken_by_notify``,
          ``woken_by_poll``, ``woken_by_timer`` (a job came due: a sleep or a wait's timeout
          ended, a retry's delay passed, of a job this worker ran or one its last look for
          work saw, e.g. left asleep by a worker that stopped);
        - its sync stage threads: ``sync_threads``, ``sync_abandoned_running``,
          ``sync_abandoned_total`` (see ``SyncStageExecutor.stats``);
        - its engine's database (every caller of the engine, not only this worker):
          ``database_retries`` (transactions retried transparently after a transient error:
          a lost connection or a conflict), ``database_outages`` (spells without an answer
          from the database, each logged as it begins and as it ends)."""
        return {
            "worker_id": self.worker_id,
            "running": len(self._active),
            "uptime_s": round(time.monotonic() - self._started_at, 3),
            "outbox_pending": self._outbox.pending,
            "outbox_retrying": self._outbox.retrying,
            "outbox_dead": self._outbox.dead,
            **dict(self._counts),
            **self.kernel.runner.sync_executor.stats(),
            "database_retries": self.kernel.db.retries,
            "database_outages": self.kernel.db.outages,
        }

    # -- the loop --------------------------------------------------------------------------
    async def _loop(self) -> None:
        next_maintenance = 0.0
        woken = False  # the last pause ended because work was announced (not the poll)
        ahead = False  # this pass looked again before pausing (``_ahead_known``)
        while not self._stopping:
            claimed, full = 0, False
            # cleared before the claim looks: a wake-up during the pass (a NOTIFY of work
            # made due after the claim looked) is kept, not lost until the next poll
            self._wake.clear()
            try:
                claimed, full = await self._claim(woken)
                now = time.monotonic()
                flush = now >= self._next_flush and (
                    self._flushing is None or self._flushing.done()
                )
                if flush and self.kernel.sink is None:
                    # (no sink here: the events wait for a host with one; the flush returns at
                    # once, without giving the event loop up: no task for it)
                    full, self._next_flush = await self._flush(now)
                elif flush:
                    self._flushing = asyncio.create_task(
                        self._flush_beside(now), name=f"wfe-flush-{self.worker_id}"
                    )
                    # (a flush to a sink that answers ends within milliseconds: waited for,
                    # see _FLUSH_WAIT_S; a slower one goes on beside the loop)
                    await asyncio.wait({self._flushing}, timeout=_FLUSH_WAIT_S)
                if now >= next_maintenance:
                    await self._maintenance()
                    next_maintenance = now + self.maintenance_interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._loop_failed(exc, "loop iteration")
                await asyncio.sleep(self.poll_interval)
            else:
                self._database_back()
            if claimed or self._stopping:
                ahead = False
                woken = full  # a full claim: more may be due (look without probing)
            elif self._wake.is_set():
                # woken during the pass: look again at once, probing first (what woke it may
                # be work this pass already claimed)
                woken = False
            elif not self._ahead_known and not ahead:
                # about to pause without knowing when the next job is due (a look found one
                # due now and claims took the rest, or a time a look saw came and was taken):
                # one look first (a read), which sets the timer for the next
                woken, ahead = False, True
            else:
                ahead = False
                woken = await self._pause()

    async def _pause(self) -> bool:
        """Wait for a wake-up or the poll: whether work was announced (not the poll)."""
        pause = self.poll_interval
        last = self.last_flush
        if last is not None and (last.delivered or last.failed or last.degraded):
            pause = min(pause, self.flush_interval)  # the outbox has work: keep at it
        try:
            await asyncio.wait_for(self._wake.wait(), pause)
        except TimeoutError:
            self._counts["woken_by_poll"] += 1
            return False
        return True

    async def _claim(self, woken: bool) -> tuple[int, bool]:
        """Lease and begin what is due, up to the free slots: (how many, whether that filled
        them)."""
        # attempts abandoned during an outage, whose leases could not be given back then:
        # given back now, so they run again at once (no-op when there are none)
        if returned := await self.kernel.return_leases():
            self._counts["leases_returned"] += returned
        free = min(self.concurrency - len(self._active), self.kernel.settings.max_claims_per_tick)
        if free <= 0:
            return 0, False
        self._looked = (self.kernel.now(), self._reports)
        jobs = await self.kernel.dispatch(
            ClaimPending(
                self.worker_id,
                limit=free,
                served=self.served,
                begin=True,
                probe=not woken,
                on_next_due=self._next_due,
            )
        )
        for job, begun in jobs:
            if begun == SKIPPED:
                self._counts["skipped"] += 1
                continue
            task = asyncio.create_task(self._run_job(job, begun))
            self._active[job.id] = (job, task)
        self._counts["claimed"] += len(jobs)
        return len(jobs), len(jobs) >= free

    # -- timers ------------------------------------------------------------------------------
    def _next_due(self, at: float | None, due: bool) -> None:
        """A look for work (``ClaimPending``) saw the earliest due time ``at`` of the jobs
        this worker would claim (None: none), ``due`` now or to come: a time to come is kept
        as a job's of its own is, so what a worker that stopped (a restart, a deploy) or
        another process left sleeping resumes on time, not at the next poll. (A time another
        process records after this look is found at the next look: the poll, or a pass that
        finds nothing due.)"""
        if due:
            self._ahead_known = False  # (the claim takes it; what comes after is not known)
            return
        self._ahead_known = True
        if at is None or self._stopping:
            return
        i = bisect.bisect_left(self._due_times, (at, 0))
        if i < len(self._due_times) and self._due_times[i][0] == at:
            self._learned.add(self._due_times[i][1])  # (kept already: a report, or a look)
            return
        self._due_at(at, learned=True)

    def _due_at(self, at: float, *, learned: bool = False) -> None:
        """A job this worker ran is due again at ``at`` (the kernel's clock), in the future
        (``ExecuteJob.on_due``; ``learned``: a look for work saw it, ``_next_due``): the loop
        looks for work then, not only at its next poll. One timer of the event loop, for the
        earliest time kept; none while stopping."""
        if self._stopping:
            self._left_due = True  # (recorded during the stop: the others are told)
            return
        times = self._due_times
        if len(times) >= _TIMERS_KEPT and at >= times[-1][0]:
            return  # (the poll, or a later look, finds it)
        self._reports += 1
        if learned:
            self._learned.add(self._reports)
        bisect.insort(times, (at, self._reports))
        if len(times) > _TIMERS_KEPT:
            self._learned.discard(times.pop()[1])
        if self._timer is None or at < self._timer_at:
            self._arm(0.0)  # (a new earliest)

    def _arm(self, least: float) -> None:
        """(Re)set the timer for the earliest due time kept, at least ``least`` s from now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._due_times and not self._stopping:
            self._timer_at = self._due_times[0][0]
            delay = max(self._timer_at - self.kernel.now(), least)
            self._timer = asyncio.get_running_loop().call_later(delay, self._ring)

    def _ring(self) -> None:
        """The timer: what has come due by the kernel's clock wakes the loop, unless the
        last claim already looked for it (it was reported before, and due when it looked: a
        sleep shorter than a pass of the loop is claimed by the pass after its suspension)."""
        come = bisect.bisect_right(self._due_times, (self.kernel.now(), math.inf))
        if come:
            looked_at, seen = self._looked
            if any(at > looked_at or n > seen for at, n in self._due_times[:come]):
                self._counts["woken_by_timer"] += 1
                self._wake.set()
            if self._learned:
                gone = {n for _, n in self._due_times[:come]} & self._learned
                if gone:
                    # a time a look saw came: the times after it were not looked for
                    self._learned -= gone
                    self._ahead_known = False
            del self._due_times[:come]
            self._early_s = 0.0
            self._arm(0.0)
            return
        self._early_s = min(max(self._early_s * 2, _TIMER_RETRY_S), self.poll_interval)
        self._arm(self._early_s)

    def _drop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due_times.clear()
        self._learned.clear()

    def _loop_failed(self, exc: Exception, what: str) -> None:
        """A loop iteration or a survey raised: the database did not answer within its retry
        budget (an outage, a restart: one WARNING, without a traceback, per outage; the calls
        go on retrying), or something else (logged with its traceback)."""
        self._counts["loop_errors"] += 1
        if not is_storage_fault(exc):
            log.exception("worker %s: %s failed; retrying", self.worker_id, what)
        elif self._away_since is None:
            self._away_since = time.monotonic()
            log.warning(
                "worker %s: the database is unreachable (%s); retrying until it is back",
                self.worker_id,
                describe_fault(exc),
            )

    def _database_back(self) -> None:
        if self._away_since is not None:
            log.info(
                "worker %s: the database answers again (unreachable for %.1fs)",
                self.worker_id,
                time.monotonic() - self._away_since,
            )
            self._away_since = None

    async def _flush_beside(self, now: float) -> None:
        """One outbox flush beside the loop; a backlog wakes the loop to flush again at once."""
        try:
            full, self._next_flush = await self._flush(now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._next_flush = time.monotonic() + self.poll_interval
            self._loop_failed(exc, "outbox flush")
            return
        if full:
            self._wake.set()

    async def _flush(self, now: float) -> tuple[bool, float]:
        """One outbox flush: whether it took all it may (a backlog: go on at once), and
        when to flush next."""
        limit = self.kernel.settings.max_outbox_flush_per_tick
        flushed = await self.kernel.dispatch(FlushOutbox(limit=limit))
        self.last_flush = flushed
        self._counts["dead_lettered"] += flushed.dead_lettered
        tried = flushed.published + flushed.failed + flushed.dead_lettered
        if tried >= limit:
            return True, now
        pause = self.flush_interval
        if not tried and flushed.sink_status == "degraded":
            # every undelivered event waits behind a retry: looking past them all again at
            # once would take the worker's time (and SQLite's write lock) for nothing; but a
            # retry is due within the longest retry delay, so never pause past that (one slow
            # look on a loaded machine must not stretch an outage into dead letters)
            cost = time.monotonic() - now
            longest = self.kernel.settings.outbox_retry_max_seconds
            pause = max(pause, min(cost / _IDLE_FLUSH_SHARE, longest))
        return False, now + pause

    async def _listen(self) -> None:
        """PostgreSQL LISTEN on the due-jobs channel (``_jobs.CHANNEL``): a notification for
        this worker's schema wakes the loop at once. A lost connection is re-opened with
        backoff; meanwhile the poll finds the work."""
        import psycopg
        from psycopg import sql

        url = make_url(self.kernel.db.url).set(drivername="postgresql")
        conninfo = url.render_as_string(hide_password=False)
        delay, failures = 0.5, 0
        while not self._stopping:
            try:
                conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
                async with conn:
                    cur = await conn.execute("SELECT current_schema()")
                    row = await cur.fetchone()
                    schema = row[0] if row else None
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    self.listening.set()
                    self._wake.set()  # what became due while nobody listened
                    if failures:
                        log.info("worker %s: the LISTEN connection is back", self.worker_id)
                    delay, failures = 0.5, 0
                    own = self.kernel.db  # (its NOTIFYs: this process wakes its workers itself)
                    async for note in conn.notifies():
                        if note.pid in own.own_backends:
                            continue
                        if note.payload == schema:
                            self._counts["woken_by_notify"] += 1
                            self._wake.set()
                        elif note.payload == f"{schema}{AHEAD}":
                            # a worker stopped: the jobs it would have woken for are looked
                            # for (the idle pass looks once more: ``_ahead_known``)
                            self._ahead_known = False
                            self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._counts["listen_errors"] += 1
                failures += 1
                # one WARNING per outage; the reconnection attempts after it at DEBUG
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "worker %s: the LISTEN connection for due jobs failed (%s); polling every "
                    "%gs until it is back",
                    self.worker_id,
                    redact_text(
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__, conninfo
                    ),
                    self.poll_interval,
                )
            finally:
                self.listening.clear()
            await asyncio.sleep(delay)
            # (capped low: a connection attempt is cheap, and the LISTEN connection should be
            # back within seconds of the server, not up to half a minute later)
            delay = min(delay * 2, _LISTEN_MAX_DELAY)

    async def _maintenance(self) -> None:
        if time.monotonic() >= self._next_survey and (
            self._surveying is None or self._surveying.done()
        ):
            self._surveying = asyncio.create_task(self._survey())
        # (the kernel logs each job taken over, and whose lease it was)
        self._counts["reaped_leases"] += await self.kernel.dispatch(ReapStaleLeases())
        if self.retention_seconds is not None:
            self._counts["purged"] += await self.kernel.dispatch(PurgeRuns(self.retention_seconds))

    async def _survey(self) -> None:
        """The parts of maintenance whose time grows with a table: the outbox gauge of
        :meth:`stats` (every undelivered event: they pile up where no host has a sink) and
        runs that lost their jobs (every active run: a backlog of a million pending runs).
        Beside the loop (it never waits for them), off the event loop (``read_long``), and
        at most ``_SURVEY_SHARE`` of the time: a survey that takes 0.1 s is taken every
        few seconds instead of every ``maintenance_interval``, and at least every
        ``_SURVEY_MAX_GAP`` (run timeouts are enforced here)."""
        started = time.monotonic()
        try:
            self._outbox = await self.kernel.db.read_long(count_outbox)
            # runs past their run timeout fail; runs that lost their jobs (after a grace of a
            # minute) are scheduled again
            clock = self.kernel.clock
            if isinstance(clock, DatabaseClock) and clock.due():
                await clock.sync(self.kernel.db)  # (before the run timeouts it decides)
            self._counts["reaped_runs"] += await self.kernel.dispatch(ReapStuckRuns())
        except Exception as exc:
            self._loop_failed(exc, "maintenance")
        took = time.monotonic() - started
        gap = min(max(self.maintenance_interval, took / _SURVEY_SHARE), _SURVEY_MAX_GAP)
        self._next_survey = time.monotonic() + gap

    def _adopt(self, handed: list[tuple[Any, Any]]) -> None:
        """Run stages the kernel handed to this worker straight from a transition (already
        leased to it and marked running)."""
        for job, begun in handed:
            self._counts["handed_off"] += 1
            self._active[job.id] = (job, asyncio.create_task(self._run_job(job, begun)))

    def free_slots(self) -> int:
        """How many more jobs this worker takes now (0 while it stops)."""
        return 0 if self._stopping else max(0, self.concurrency - len(self._active))

    def serves(self, wfv: str) -> bool:
        return wfv in self.served if self.served is not None else self.kernel.serves(wfv)

    def adopt(self, handed: list[tuple[Any, Any]]) -> bool:
        """Run stages handed to this worker by a transaction made elsewhere in this process
        (a start): False, and nothing adopted, when the worker is stopping."""
        if self._stopping:
            return False
        self._adopt(handed)
        return True

    async def _run_job(self, job: Any, begun: Any = None) -> None:
        """Run ``job``; then, when its outcome handed exactly one stage on to this worker, run
        that one in this task too (a task made per handed-on stage cost a turn of the event
        loop between a stage and the next, and the task's making and ending)."""
        current = asyncio.current_task()
        following: tuple[Any, Any] | None = (job, begun)
        while following is not None:
            following = await self._run_one(*following, current)

    async def _run_one(
        self, job: Any, begun: Any, current: asyncio.Task[Any] | None
    ) -> tuple[Any, Any] | None:
        """One job of :meth:`_run_job`: the stage handed on that this task runs next."""
        adopted: list[bool] = []
        following: list[tuple[Any, Any]] = []

        def on_handoff(handed: list[tuple[Any, Any]]) -> None:
            adopted.append(True)
            if len(handed) == 1 and current is not None and not following:
                # (leased to this worker and marked running: this task runs it next)
                following.append(handed[0])
                self._counts["handed_off"] += 1
                self._active[handed[0][0].id] = (handed[0][0], current)
            else:
                self._adopt(handed)

        try:
            free = max(0, self.concurrency - len(self._active) + 1)
            command = ExecuteJob(
                job,
                self.worker_id,
                handoff=0 if self._stopping else free,
                on_handoff=on_handoff,
                begun=begun,
                on_due=self._due_at,
            )
            result = await self.kernel.dispatch(command)
            self._counts[str(result)] += 1
            if result == "cancelled":
                wf = str(job.wfv).split("@", 1)[0]
                log.info(
                    "run %s %s/%s attempt %d: stage cancelled (the run was cancelled or stopped)",
                    job.run_id,
                    wf,
                    job.stage_id,
                    job.attempt,
                    extra={
                        "wfe_run_id": job.run_id,
                        "wfe_workflow": wf,
                        "wfe_stage": job.stage_id,
                        "wfe_attempt": job.attempt,
                        "wfe_worker": self.worker_id,
                    },
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "worker %s: job %s of run %s failed in the engine",
                self.worker_id,
                job.id,
                job.run_id,
            )
            self._counts["engine_errors"] += 1
        finally:
            full = len(self._active) >= self.concurrency
            self._active.pop(job.id, None)
            if full or not adopted:
                # a slot freed, or the outcome left work for the queue: look for it
                self._wake.set()
            if self.on_job_done is not None:
                self.on_job_done(job.run_id)
        return following[0] if following else None


def _some(ids: list[str], most: int = 10) -> str:
    """Up to ``most`` ids for one log line, and how many more."""
    shown = ", ".join(ids[:most])
    return f"{shown} and {len(ids) - most} more" if len(ids) > most else shown
