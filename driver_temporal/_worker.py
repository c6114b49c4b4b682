"""Hosting: ``engine.worker()`` runs temporalio Workers for the engine's registry, one per
served (workflow, version): on the workflow's task queue, as the Worker Deployment version
(deployment = task queue without '.', build id = definition version) with PINNED workflows."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from contextlib import AsyncExitStack
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.service import RPCError
from temporalio.worker import Worker

from engine_port.errors import UnsupportedFeatureError

from . import _rpc
from ._ended import noticing
from ._helpers import in_background
from ._outage import PROBE_EVERY_S, probe
from ._purge import retention
from ._workflow import GraphWorkflow, workflow_runner

if TYPE_CHECKING:
    from ._engine import TemporalEngine

__all__ = ["EngineWorker", "run_worker_forever"]


class EngineWorker:
    """An async context manager running one temporalio Worker per served (workflow, version).

    Options: ``graceful_shutdown_timeout`` (seconds running activities get to finish on exit),
    ``max_concurrent_activities``, ``sticky_queue_timeout`` (seconds before a workflow task
    cached on a lost worker moves to another one).
    """

    def __init__(
        self,
        engine: TemporalEngine,
        *,
        graceful_shutdown_timeout: float = 5.0,
        max_concurrent_activities: int = 100,
        sticky_queue_timeout: float = 5.0,
    ) -> None:
        self.engine = engine
        self.graceful_shutdown_timeout = graceful_shutdown_timeout
        self.max_concurrent_activities = max_concurrent_activities
        self.sticky_queue_timeout = sticky_queue_timeout
        self.task_queues: list[str] = []
        self._keys: list[tuple[str, str]] = []  # (task queue, version) of each worker
        self._stack: AsyncExitStack | None = None

    def _workers(self) -> list[Worker]:
        eng = self.engine
        acts = eng._activities
        workers = []
        for wf_id, version in sorted(eng.registry.served()):
            tq = eng.task_queue(wf_id, version)
            self.task_queues.append(tq)
            grace = timedelta(seconds=self.graceful_shutdown_timeout)
            # one worker per version: workflow tasks, their local activities and the stage
            # activities, so a stage activity the workflow schedules starts eagerly (handed
            # back with the workflow task's completion, no matching round trip)
            workers.append(
                Worker(
                    eng._conn,
                    task_queue=tq,
                    deployment_config=eng.deployment_config(wf_id, version),
                    workflows=[GraphWorkflow],
                    activities=[acts.stage, *acts.bookkeeping()],
                    workflow_runner=workflow_runner(),
                    # its runs answer this engine's signal() in process and have their end
                    # recorded by it (``_run_end``)
                    interceptors=[eng._externs()],
                    graceful_shutdown_timeout=grace,
                    max_concurrent_activities=self.max_concurrent_activities,
                    sticky_queue_schedule_to_start_timeout=timedelta(
                        seconds=self.sticky_queue_timeout
                    ),
                )
            )
        return workers

    async def __aenter__(self) -> Self:
        await self.engine.connect()
        stack = AsyncExitStack()
        try:
            eng = self.engine
            self._keys = [(eng.task_queue(w, v), v) for w, v in sorted(eng.registry.served())]
            hosted = eng._hosted
            for key in self._keys:
                hosted[key] = hosted.get(key, 0) + 1  # no new helper from here on
            stack.callback(self._unhost)
            for key in self._keys:
                # a helper of the version must stop first: Temporal refuses a second worker
                # of one task queue and build id in a process (even a workflow-only one)
                await eng._drop_helper(key)
            try:
                workers = self._workers()
            except RuntimeError as exc:
                if "multiple workers" not in str(exc):
                    raise
                # (Temporal's core: one worker per namespace, task queue and build id in a
                # process; natively any number of workers may run in one process)
                raise UnsupportedFeatureError(
                    "a worker for these workflow versions already runs in this process (another "
                    "engine.worker() of this or another engine); the Temporal driver runs one "
                    "per process: use that one (max_concurrent_activities= sets how many stages "
                    "it runs at once), or start another process"
                ) from None
            for w in workers:
                await stack.enter_async_context(w)
            await stack.enter_async_context(retention(eng))  # the retention setting (issue 16)
            # runs Temporal ended outside the engine: their closing event (``_ended``)
            await stack.enter_async_context(noticing(eng, [tq for tq, _ in self._keys]))
            # an outage its polls met (one WARNING, ``_outage``): one INFO once Temporal is back
            await stack.enter_async_context(in_background(_probing(eng), "wfe-temporal-probe"))
            current = asyncio.create_task(self._make_current())
            stack.push_async_callback(_cancelled, current)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def _make_current(self) -> None:
        """Make each served version that is its workflow's latest the current version of its
        Worker Deployment, once its workers poll (the Web UI's Deployments page then shows it
        current instead of "No Current Version"). Routing stays by pin (every run is started
        pinned to its version): this only tells operators which version is live. A version
        older than the deployment's current one (an old process restarting) leaves it."""
        eng = self.engine
        for wf_id, version in sorted(eng.registry.served()):
            if eng.registry.latest_version(wf_id) != version:
                continue
            with contextlib.suppress(Exception):  # informative only: never fail the worker
                await _set_current(eng, wf_id, version)

    def _unhost(self) -> None:
        hosted = self.engine._hosted
        for key in self._keys:
            hosted[key] = hosted.get(key, 1) - 1
            if hosted[key] <= 0:
                del hosted[key]

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()


async def _probing(eng: TemporalEngine) -> None:
    """While a worker runs: whether Temporal answers again, during an outage noticed."""
    while True:
        await asyncio.sleep(PROBE_EVERY_S)
        await probe(eng._conn)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def _set_current(eng: TemporalEngine, wf_id: str, version: str) -> None:
    dv = eng.deployment_version(wf_id, version)
    svc = eng._conn.workflow_service
    ns = eng.settings.temporal_namespace
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0
    describe = functools.partial(
        svc.describe_worker_deployment,
        DescribeWorkerDeploymentRequest(namespace=ns, deployment_name=dv.deployment_name),
    )
    while True:
        try:
            desc = await _rpc.call("describing a Worker Deployment", describe)
        except RPCError:
            # not found until the server saw the first poll of one of its versions
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        info = desc.worker_deployment_info
        current = info.routing_config.current_deployment_version.build_id
        if current == version:
            return
        created = {
            v.deployment_version.build_id: v.create_time.ToDatetime()
            for v in info.version_summaries
        }
        newer = current in created and version in created and created[current] > created[version]
        if current and newer:
            return  # a newer version is current already
        req = SetWorkerDeploymentCurrentVersionRequest(
            namespace=ns,
            deployment_name=dv.deployment_name,
            build_id=version,
            conflict_token=desc.conflict_token,
            identity="wfe worker",
        )
        try:
            await _rpc.call(
                "setting the current Worker Deployment version",
                functools.partial(svc.set_worker_deployment_current_version, req),
            )
            return
        except RPCError:
            # no pollers seen yet, or a concurrent change (conflict token): look again
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def run_worker_forever(engine: TemporalEngine, **options: Any) -> None:
    """Run the engine's workers until SIGINT/SIGTERM, then shut down gracefully
    (``wfe worker`` with ``driver = "temporal"``)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with engine, engine.worker(**options) as worker:
        print(
            f"wfe worker (temporal) on {engine.settings.temporal_address}, task queues: "
            + ", ".join(f"{tq} (build {v})" for tq, v in worker._keys),
            flush=True,
        )
        await stop.wait()
