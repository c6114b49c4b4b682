"""NativeEngine: the WorkflowEngine port on the native kernel."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from engine_port import (
    BlobStore,
    ClaimCheck,
    EngineSettings,
    ErrorInfo,
    Event,
    EventSink,
    FlushResult,
    GraphModel,
    Registry,
    RunInfo,
    RunSnapshot,
    RunStatus,
    SignalResult,
    StageInfo,
    SystemClock,
    VersionInfo,
    Workflow,
    WorkflowEngine,
    is_spill_ref,
    open_blob_store,
)
from engine_port.driver import (
    TERMINAL_RUN_STATUSES,
    Clock,
    StepEntry,
    check_events_call,
    check_export_target,
    check_import_blobs,
    check_import_call,
    check_list_call,
    check_page_call,
    check_purge_call,
    check_run_call,
    check_signal_call,
    check_start_input,
    check_version,
    check_wait_call,
    check_wait_seconds,
    check_worker_options,
    check_workflow_ids,
    keyed_repeat,
    start_definition,
    telemetry,
    version_key,
)
from engine_port.errors import (
    DriverUnavailableError,
    InvalidInputError,
    MigrationError,
    RunNotFoundError,
    UnsupportedFeatureError,
    WaitTimeoutError,
)

from . import _migration, _outbox, _runs
from ._commands import (
    CancelRun,
    CreateRun,
    FlushOutbox,
    ListVersions,
    PurgeRuns,
    RedriveRun,
    ReleaseJobs,
    ReplayDlq,
    SignalStep,
)
from ._db import Database
from ._dbclock import DatabaseClock
from ._gauges import read_gauges
from ._kernel import Kernel
from ._progress import Handoff
from ._sql import try_run
from ._watch import RunWatch
from ._worker import WorkerHost

__all__ = ["NativeEngine", "create_native_engine"]


_LOCAL_POLL_S = 0.5
"""How often wait() reads the status of a run that a local worker executes (its completion
wakes wait() at once; the read covers a run that moved elsewhere, e.g. after a shutdown)."""

_SETTLE_S = 5.0
"""How long ``close()`` lets a transaction whose caller is gone (a heartbeat cancelled as its
stage ended) end before it is cancelled and rolled back."""


async def _wait_event(event: asyncio.Event, timeout: float) -> None:
    """``event.wait()`` for ``timeout`` seconds at most (then return all the same), in the
    calling task: ``asyncio.wait_for`` wraps the wait in a task of its own, which costs two
    more turns of the event loop before the caller resumes."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


def _release(handed: list[tuple[Any, Any]], worker: str) -> ReleaseJobs:
    """Give back the leases of stages handed to ``worker`` (the claims they were handed by)."""
    ids = tuple(int(job.id) for job, _ in handed)
    return ReleaseJobs(ids, worker, tuple(int(job.lease_token) for job, _ in handed))


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC)


def _parse_cursor(cursor: str) -> tuple[float, str]:
    at, sep, run_id = cursor.partition("~")
    try:
        value = float(at)
    except ValueError:
        value = math.nan
    if (
        not sep
        or not run_id
        or not math.isfinite(value)
        or repr(value) != at  # (float() read " 1 ", "1_000", other digits: a cursor is repr)
        or len(cursor) > 100
        or any(c == "\x00" or "\ud800" <= c <= "\udfff" for c in run_id)  # (PG refused it raw)
    ):
        raise InvalidInputError(
            None, f"{cursor[:100]!r} is not a page cursor; use the one the previous page gave"
        )
    return value, run_id


class NativeEngine(WorkflowEngine):
    """The native driver: SQLite (embedded default) or PostgreSQL, plus a blob store.
    Option: ``cancel_wait`` (seconds cancel() waits for a worker to end the run; 10)."""

    driver_name = "native"

    def __init__(
        self,
        settings: EngineSettings,
        registry: Registry,
        *,
        event_sink: EventSink | None = None,
        blob_store: BlobStore | None = None,
        clock: Clock | None = None,
        cancel_wait: float = 10.0,
    ) -> None:
        super().__init__(registry)
        self.settings = settings
        self.event_sink = event_sink
        self.blob_store = blob_store
        self.clock: Clock = clock or SystemClock()
        # how long cancel() waits for a worker to carry the cancellation out (as on Temporal)
        self.cancel_wait = check_wait_seconds(cancel_wait)
        self._kernel: Kernel | None = None
        self._hosts: list[WorkerHost] = []
        self._waiters: dict[str, set[asyncio.Event]] = {}
        # runs handed to a worker of this process at start: wait() learns of their end from
        # that worker and polls the database only as a slow safety net
        self._local_runs: set[str] = set()
        # run id -> its final state (``_runs.read_run``'s rows) read by the transaction that
        # completed it in this process, kept while someone waits for it
        self._finals: dict[str, tuple[Any, list[Any], GraphModel | None]] = {}
        # the runs wait() looks at, all in one query per tick
        self._watch = RunWatch(self._statuses)

    # -- connection ------------------------------------------------------------------------
    async def connect(self) -> None:
        if self._kernel is not None:
            return
        db = Database(
            self.settings.database_url.reveal(),
            retry_seconds=self.settings.database_retry_seconds,
        )
        await asyncio.get_running_loop().run_in_executor(None, db.upgrade)
        store = self.blob_store
        if store is None:
            blob_url = self.settings.blob_url.reveal()
            if db.is_postgres and "blob_url" not in self.settings.model_fields_set:
                # a relative folder would differ per host: without a blob_url of its own,
                # PostgreSQL keeps the blobs too, so every worker and the CLI can read them
                blob_url = "db://"
            if blob_url.startswith("db://"):
                from ._dbblobs import DatabaseBlobStore

                store = DatabaseBlobStore(db)
            else:
                store = open_blob_store(self.settings.blob_url)
        claim = ClaimCheck(store, self.settings.spill_threshold_bytes)
        if db.is_postgres and type(self.clock) is SystemClock:
            # every host compares the times the others wrote: the database's clock decides
            self.clock = DatabaseClock(self.clock)
        if isinstance(self.clock, DatabaseClock):
            await self.clock.sync(db)
        self._kernel = Kernel(db, self.registry, self.settings, claim, self.clock, self.event_sink)
        self._kernel.on_run_finished = self._job_done
        self._kernel.wants_final = self._waiters.__contains__

    async def close(self) -> None:
        for host in list(self._hosts):
            await host.stop()
        await self._watch.close()
        if self._kernel is not None:
            self._kernel.runner.close()
            await self._kernel.db.settle(_SETTLE_S)
            self._kernel.db.dispose()
            self._kernel = None

    @property
    def spill_store(self) -> BlobStore | None:
        return None if self._kernel is None else self._kernel.claim.store

    @property
    def kernel(self) -> Kernel:
        if self._kernel is None:
            raise DriverUnavailableError(
                "the engine is not connected; use `async with engine:` first"
            )
        return self._kernel

    async def _statuses(self, run_ids: list[str]) -> dict[str, str]:
        return await self.kernel.db.read(_runs.run_statuses, run_ids)

    def _wake(self) -> None:
        for host in self._hosts:
            host.wake()

    def _job_done(self, run_id: str, final: Any = None) -> None:
        """A transition in this process ended ``run_id``: wake whoever waits for that run
        (``final``: the run's state as that transaction left it, for them to return)."""
        self._local_runs.discard(run_id)
        if final is not None and run_id in self._waiters:
            self._finals[run_id] = final
        for event in self._waiters.get(run_id, ()):
            event.set()

    def _known_graph(self, workflow_id: str, version: str) -> GraphModel | None:
        if self.registry.has(workflow_id, version):
            return self.registry.graph(workflow_id, version)
        return None

    def _local_host(self, wfv: str) -> WorkerHost | None:
        """A worker of this process that serves ``wfv`` and has a free slot: a run started
        here is handed to it directly."""
        for host in self._hosts:
            if host.free_slots() > 0 and host.serves(wfv):
                return host
        return None

    # -- the port --------------------------------------------------------------------------
    @telemetry.traced_start
    async def start(
        self,
        workflow: str | Workflow[Any],
        input: Any,
        *,
        idempotency_key: str | None = None,
        version: str | None = None,
    ) -> RunInfo:
        wf = start_definition(self.registry, workflow, idempotency_key, version)
        value = check_start_input(wf, input)  # validated once: the stored and reported input
        created_at = self.clock.now()
        host, handoff = self._local_host(version_key(wf.id, wf.version)), None
        if host is not None:
            handoff = Handoff(
                host.worker_id, self.kernel.settings.lease_threshold, host.free_slots()
            )
        run_id, created = await self.kernel.dispatch(
            CreateRun(
                wf.id,
                value,
                idempotency_key,
                wf.version,  # (resolved: a Workflow object's own version, see start_definition)
                trace_context=telemetry.current_traceparent(),  # of wfe.run: stored with the run
                handoff=handoff,
                validated=True,
            )
        )
        if host is not None and handoff is not None and handoff.jobs:
            if host.adopt(handoff.jobs):
                self._local_runs.add(run_id)
            else:  # it began to stop meanwhile: back to the queue
                await self.kernel.dispatch(_release(handoff.jobs, host.worker_id))
                self._wake()
        else:
            self._wake()
        if not created:  # an idempotent repeat: report the run as it is now
            return keyed_repeat(await self.get_run(run_id))
        graph = wf.graph()
        return RunInfo(  # just written by this call: no need to read it back
            id=run_id,
            workflow_id=wf.id,
            version=graph.version,
            status=RunStatus.PENDING,
            input=value,
            stages=[StageInfo(id=s, status="pending") for g in graph.groups for s in g],
            idempotency_key=idempotency_key,
            created_at=created_at,
            updated_at=created_at,
        )

    async def get_run(self, run_id: str) -> RunInfo:
        check_run_call(run_id)
        run, stage_rows, graph = await self.kernel.db.read(
            _runs.read_run, run_id, self._known_graph
        )
        return await self._info(run, stage_rows, graph)

    async def get_run_lazy(self, run_id: str) -> tuple[RunInfo, dict[str, int]]:
        """:meth:`get_run` without reading the blob store: a spilled value is None in the
        RunInfo and its size in bytes is in the dict, under ``input``, ``stage:ID`` or
        ``output:ID`` (a sink's part of the run output). The web view shows a run this way
        and fetches a spilled value only when asked."""
        check_run_call(run_id)
        run, stage_rows, graph = await self.kernel.db.read(
            _runs.read_run, run_id, self._known_graph
        )
        spilled: dict[str, int] = {}
        return await self._info(run, stage_rows, graph, spilled=spilled), spilled

    async def _info(
        self,
        run: Any,
        stage_rows: list[Any],
        graph: GraphModel | None,
        *,
        outputs: bool = True,
        spilled: dict[str, int] | None = None,
    ) -> RunInfo:
        """A RunInfo from a run's row, its stage rows and its definition (spilled values are
        read from the blob store, unless ``spilled`` is given: then they are None there and
        their sizes are put in it; with ``outputs=False`` no value is read)."""
        k = self.kernel

        async def load(value: Any, where: str) -> Any:
            if spilled is not None and is_spill_ref(value):
                ref = value[next(iter(value))]
                spilled[where] = int(ref.get("size", 0)) if isinstance(ref, dict) else 0
                return None
            return await k.claim.load(value, run_id=run.id)

        order = (
            {sid: i for i, sid in enumerate(s for g in graph.groups for s in g)} if graph else {}
        )
        stage_infos = []
        for r in sorted(stage_rows, key=lambda r: order.get(r.stage_id, 0)):
            stage_infos.append(
                StageInfo(
                    id=r.stage_id,
                    status=r.status,
                    attempt=r.attempt,
                    output=(
                        await load(r.output, f"stage:{r.stage_id}")
                        if r.has_output and outputs
                        else None
                    ),
                    error=ErrorInfo.model_validate(r.error) if r.error else None,
                    compensation_error=(
                        ErrorInfo.model_validate(r.compensation_error)
                        if r.compensation_error
                        else None
                    ),
                    waiting_for=r.waiting_for,
                    wake_at=_dt(r.wake_at),
                    started_at=_dt(r.started_at),
                    finished_at=_dt(r.finished_at),
                )
            )
        output = None
        if outputs and run.status == RunStatus.COMPLETED and graph is not None:
            sinks = graph.sinks()
            if len(sinks) == 1:
                output = await load(run.output, f"output:{sinks[0]}")
            else:
                output = {s: await load(v, f"output:{s}") for s, v in (run.output or {}).items()}
        return RunInfo(
            id=run.id,
            workflow_id=run.workflow_id,
            version=run.version,
            status=run.status,
            input=await load(run.input, "input") if outputs else None,
            output=output,
            error=ErrorInfo.model_validate(run.error) if run.error else None,
            compensation_errors=[
                ErrorInfo.model_validate(e) for e in run.compensation_errors or []
            ],
            stages=stage_infos,
            idempotency_key=run.idempotency_key,
            migrated_to=run.migrated_to,
            redrive_count=run.redrive_count,
            created_at=_dt(run.created_at),
            updated_at=_dt(run.updated_at),
            finished_at=_dt(run.finished_at),
            # (complete_export clears it as it marks the run migrated)
            frozen=bool(run.frozen) and RunStatus(run.status) not in TERMINAL_RUN_STATUSES,
        )

    async def list_runs(
        self,
        *,
        workflow_id: str | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 100,
        id_prefix: str | None = None,
        outputs: bool = True,
    ) -> list[RunInfo]:
        statuses = check_list_call(workflow_id, status, limit, id_prefix)
        found = await self.kernel.db.read(
            _runs.read_runs, workflow_id, statuses, limit, None, id_prefix
        )
        return [await self._info(run, rows, graph, outputs=outputs) for run, rows, graph in found]

    async def wait(self, run_id: str, timeout: float | None = None) -> RunInfo:
        """Wait for a terminal status: woken at once by this process's workers, and looking
        (with every other wait of this engine: ``_watch``) at runs that workers in other
        processes execute."""
        timeout = check_wait_call(run_id, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        event = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(event)
        # a run handed to a worker of this process is still running (its end would have taken
        # it out of ``_local_runs``): a status read now would find it running, so wait for
        # that worker's word, with a slow look as the safety net (it may move elsewhere)
        local = run_id in self._local_runs and bool(self._hosts)
        watched = None
        try:
            if not local:
                status = await self.kernel.db.read(_runs.run_status, run_id)
                if RunStatus(status) in TERMINAL_RUN_STATUSES:
                    return await self.get_run(run_id)
            watched = self._watch.watch(run_id, event, every=_LOCAL_POLL_S if local else None)
            while deadline is None or time.monotonic() < deadline:
                if deadline is None:
                    await event.wait()
                else:
                    await _wait_event(event, deadline - time.monotonic())
                if not event.is_set():
                    break  # the deadline
                final = self._finals.get(run_id)
                if final is not None:  # its state, read by the transaction that ended it
                    return await self._info(*final)
                info = await self.get_run(run_id)
                if info.status in TERMINAL_RUN_STATUSES:
                    self._local_runs.discard(run_id)
                    return info
                event.clear()
            status = await self.kernel.db.read(_runs.run_status, run_id)
            if RunStatus(status) in TERMINAL_RUN_STATUSES:
                return await self.get_run(run_id)
            raise WaitTimeoutError(
                f"run {run_id!r} is still {status} after {timeout}s; is a worker "
                "running for its workflow version? (engine.worker() or `wfe worker`)"
            )
        finally:
            if watched is not None:
                self._watch.unwatch(watched)
            waiting = self._waiters.get(run_id, set())
            waiting.discard(event)
            if not waiting:
                self._waiters.pop(run_id, None)
                self._finals.pop(run_id, None)

    @telemetry.traced_signal
    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> SignalResult:
        check_signal_call(run_id, name, payload, idempotency_key)
        host = next((h for h in self._hosts if h.free_slots() > 0), None)
        handoff, served = None, frozenset[str]()
        if host is not None:
            handoff = Handoff(host.worker_id, self.kernel.settings.lease_threshold, 1)
            served = host.served if host.served is not None else self.kernel.served()
        result: SignalResult = await self.kernel.dispatch(
            SignalStep(run_id, name, payload, idempotency_key, handoff=handoff, served=served)
        )
        if host is not None and handoff is not None and handoff.jobs:
            # the woken stage is leased to this process's worker and begun: it resumes at
            # once, without a wake-up, a look for due jobs and a claim
            if host.adopt(handoff.jobs):
                self._local_runs.add(run_id)
                return result
            # it began to stop meanwhile
            await self.kernel.dispatch(_release(handoff.jobs, host.worker_id))
        self._wake()
        return result

    async def cancel(self, run_id: str) -> RunInfo:
        check_run_call(run_id)
        requested = await self.kernel.dispatch(CancelRun(run_id))
        self._wake()
        info = await self.get_run(run_id)
        if info.status in TERMINAL_RUN_STATUSES:
            self._job_done(run_id)  # ended here and now: wake this process's wait() calls
        elif requested and self.cancel_wait > 0:
            # a worker (of this process or another) compensates and ends it: as on Temporal,
            # cancel() returns the run once it has ended, or its status after cancel_wait
            with contextlib.suppress(WaitTimeoutError):
                info = await self.wait(run_id, timeout=self.cancel_wait)
        return info

    async def redrive(
        self, run_id: str, from_: str = "last_failure", *, version: str | None = None
    ) -> RunInfo:
        check_run_call(run_id)
        if version is not None:
            check_version(version)
        await self.kernel.dispatch(RedriveRun(run_id, from_, version))
        self._local_runs.discard(run_id)  # it runs wherever a worker claims it now
        self._wake()
        return await self.get_run(run_id)

    async def list_versions(self) -> list[VersionInfo]:
        result: list[VersionInfo] = await self.kernel.dispatch(ListVersions())
        return result

    async def export_run(self, run_id: str, *, wait: float = 0.0) -> RunSnapshot:
        check_run_call(run_id)
        deadline = time.monotonic() + check_wait_seconds(wait)
        first = True
        try:
            while True:
                snapshot = await self.kernel.db.tx(_migration.freeze_and_snapshot, run_id)
                if snapshot is not None:
                    return snapshot
                first = False
                if time.monotonic() >= deadline:
                    raise MigrationError(
                        f"run {run_id!r} has a stage running; it is not at a safe point (wait "
                        "longer, or migrate it later)"
                    )
                await asyncio.sleep(0.05)
        except BaseException:
            if not first:  # (frozen while its stage ran: it goes on here)
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.abort_export(run_id))
            raise

    async def complete_export(self, run_id: str, target: str) -> RunInfo:
        check_run_call(run_id)
        check_export_target(target)
        await self.kernel.db.tx(_migration.complete_export, run_id, target, self.kernel.now())
        return await self.get_run(run_id)

    async def drain(self, workflow_ids: Sequence[str], target: str | None) -> None:
        check_workflow_ids(workflow_ids)
        if target is not None:
            check_export_target(target)
        await self.kernel.db.tx(_runs.set_drain, list(workflow_ids), target, self.kernel.now())

    async def abort_export(self, run_id: str) -> None:
        check_run_call(run_id)
        await self.kernel.db.tx(_migration.abort_export, run_id)
        self._wake()

    async def import_run(self, snapshot: RunSnapshot | Mapping[str, Any]) -> RunInfo:
        snapshot = check_import_call(snapshot)
        # (every spilled value it refers to readable here before the run is written: a
        # failed import leaves nothing behind)
        await check_import_blobs(snapshot, self.kernel.claim.store)
        if snapshot.graph is not None:
            graph = GraphModel.model_validate(snapshot.graph)
        else:
            graph = self.registry.graph(snapshot.workflow_id, snapshot.version)
        await self.kernel.db.tx(
            _migration.import_snapshot,
            snapshot,
            graph,
            self.kernel.now(),
            self.settings.max_pending_signals,
        )
        self._wake()
        return await self.get_run(snapshot.run_id)

    @contextlib.asynccontextmanager
    async def worker(self, **options: Any) -> AsyncIterator[WorkerHost]:
        check_worker_options(self.driver_name, options, WORKER_NUMBERS, WORKER_OTHERS)
        host = WorkerHost(self.kernel, **options)
        self._hosts.append(host)
        try:
            async with host:
                yield host
        finally:
            self._hosts.remove(host)

    async def flush_events(self) -> FlushResult:
        result: FlushResult = await self.kernel.dispatch(FlushOutbox(force=True))
        return result

    async def replay_dlq(self) -> int:
        n: int = await self.kernel.dispatch(ReplayDlq())
        return n

    # -- native extras ---------------------------------------------------------------------
    async def events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """Every event the run wrote to its outbox, in sequence order (delivered or not);
        a page of them with ``after_seq`` (only those whose ``seq`` is above it: the last
        ``seq`` of the previous page) and ``limit`` (at most this many). The page loop ends
        on a page shorter than ``limit``. The database reads the page off the outbox's
        (run id, seq) index, however deep it is. Raises RunNotFoundError for a run that is
        not here (as on Temporal), InvalidInputError for a bad ``after_seq`` or ``limit``."""
        check_events_call(run_id, after_seq, limit)
        return await self.kernel.db.read(_run_events, run_id, after_seq, limit)

    async def outbox_counts(self) -> _outbox.OutboxCounts:
        """Undelivered events in the outbox: ``pending`` (not failed yet), ``retrying`` (the
        sink failed; waiting for a retry) and ``dead`` (dead letters; ``replay_dlq()``)."""
        counts: _outbox.OutboxCounts = await self.kernel.db.read_long(_outbox.count_outbox)
        return counts

    async def list_runs_page(
        self,
        *,
        workflow_id: str | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 100,
        after: str | None = None,
        version: str | None = None,
        created_after: datetime | None = None,
        id_prefix: str | None = None,
        idempotency_key: str | None = None,
        outputs: bool = True,
    ) -> tuple[list[RunInfo], str | None]:
        """One page of :meth:`list_runs` (newest first) and the cursor of the next page (None
        on the last one): keyset pagination on (creation time, run id), never OFFSET, so the
        page after a cursor costs the same however deep it is. Every filter is applied by the
        database (one ``version``, created at or after ``created_after``, ``id_prefix``, one
        ``idempotency_key``), so a match older than any number of newer runs is found."""
        statuses = check_list_call(workflow_id, status, limit, id_prefix)
        created_after = check_page_call(after, version, created_after, idempotency_key)
        before = _parse_cursor(after) if after is not None else None
        since = None if created_after is None else created_after.timestamp()
        found = await self.kernel.db.read(
            _runs.read_runs,
            workflow_id,
            statuses,
            limit + 1,
            before,
            id_prefix,
            version,
            since,
            idempotency_key,
        )
        page = [
            await self._info(run, rows, graph, outputs=outputs)
            for run, rows, graph in found[:limit]
        ]
        # (limit=0 read one run and gave it as the next page's cursor: a page loop never ended)
        last = found[limit - 1][0] if limit and len(found) > limit else None
        return page, None if last is None else f"{last.created_at!r}~{last.id}"

    async def steps(self, run_id: str) -> list[StepEntry]:
        """The run's journaled steps (without their results), by stage and name."""
        check_run_call(run_id)
        return await self.kernel.db.read(_runs.list_steps, run_id)

    async def dead_letters(self, limit: int = 1000) -> list[Event]:
        return await self.kernel.db.read(_outbox.load_dead, limit)

    async def purge(
        self,
        older_than: timedelta | float | None = None,
        *,
        older_than_seconds: float | None = None,
    ) -> int:
        seconds = check_purge_call(older_than_seconds if older_than is None else older_than)
        n: int = await self.kernel.dispatch(PurgeRuns(seconds))
        return n

    async def gauges(self) -> dict[str, Any]:
        """Runs per (workflow, status) and the queue lag, for a worker's ``/metrics``."""
        return await self.kernel.db.read_long(read_gauges, self.kernel.now())


# ``worker(**options)``: the numbers (whole?, minimum) and the other options of a WorkerHost
WORKER_NUMBERS = {
    "concurrency": (True, 1),
    "poll_interval": (False, 0),
    "maintenance_interval": (False, 0),
    "flush_interval": (False, 0),
    "retention_seconds": (False, 0),
    "shutdown_timeout": (False, 0),
}
WORKER_OTHERS = ("worker_id", "served", "on_job_done", "listen")


def _run_events(
    conn: Any, run_id: str, after_seq: int | None = None, limit: int | None = None
) -> list[Event]:
    found = _outbox.load_events(conn, run_id, after_seq, limit)
    if not found and try_run(conn, run_id, lock=False) is None:
        raise RunNotFoundError(run_id)  # (a run writes run.created as it is created)
    return found


def create_native_engine(
    settings: EngineSettings,
    registry: Registry,
    *,
    event_sink: EventSink | None = None,
    blob_store: BlobStore | None = None,
    clock: Clock | None = None,
    **options: Any,
) -> NativeEngine:
    unknown = sorted(set(options) - {"cancel_wait"})
    if unknown:
        raise UnsupportedFeatureError(f"the native driver does not support the options {unknown}")
    return NativeEngine(
        settings, registry, event_sink=event_sink, blob_store=blob_store, clock=clock, **options
    )
