"""The Temporal server restarts (SIGTERM, SIGKILL) or stays down 8-15 s under a stream of runs,
with its state in a database file: no run is lost or stuck, no stage attempt is charged (no
``stage.failed``, attempt 1 everywhere), no journaled step runs twice, both workers (one in
process, one a ``run_worker_forever`` subprocess) recover on their own and the subprocess
neither exits nor floods its log, events reach the sink with stable ids, and every client call
made while the server is down raises ``DriverUnavailableError`` (never temporalio's
``RPCError``) within a bound, saying what to do; ``wait(timeout=T)`` within about T. An
outage is logged once by each process (a WARNING when Temporal stops answering, an INFO when
it answers again), not once per retried poll.

Run as a module (``python -m tests.integration.temporal.test_server_restart``), this file is
the subprocess worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.deployment.v1 import WorkerDeploymentVersion as PbDeploymentVersion
from temporalio.api.enums.v1 import RoutingConfigUpdateState, TaskQueueType
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    DescribeWorkerDeploymentVersionRequest,
)
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from driver_temporal import TemporalDevServer, create_temporal_engine
from driver_temporal._outage import CORE_LOGGER, OutageFilter
from engine_port import EngineSettings, FolderBlobStore, Registry, StageContext, Workflow
from engine_port.errors import DriverUnavailableError

from .crash_app import FileSink

pytestmark = pytest.mark.temporal

ROOT = Path(__file__).resolve().parents[3]
# After the server answers again, every run of a batch ends within this. The worst a run may
# legitimately need, from the driver's and Temporal's timeouts: the workers' polls resume within
# 12 s (temporalio's core retries a poll with backoff capped at 10 s, +20 % jitter: the 8-15 s
# outage reaches the cap, a 1-2 s restart ~1.6 s); meanwhile Temporal retries a workflow task
# started before the stop once its timeout passes (10 s, Temporal's default: the driver sets
# none), and times out the stage activity that could not heartbeat through the outage
# (heartbeat_timeout, 3 s) to retry it after _INFRA_RETRY's first interval (0.5 s); a task
# dispatched to a worker's sticky queue that lost its poll moves on after sticky_queue_timeout
# (2 s, once or twice); then the rest of the run (the signal, a ~1 s timer, 2 activities, ~5
# workflow tasks: ~3 s on a loaded host). 12 + 2 x 2 + 3 = ~20 s; twice that for a loaded host.
RECOVER_S = 40.0
# Temporal's own setup of the workers' new Worker Deployment version (the first polls register
# it on the queue, the first worker makes it current) is done by its system workflows within a
# second or two; a bound for a loaded host
SETTLE_S = 60.0
DOWN_CALL_S = 25.0  # a client call while the server is down raises within this
WAIT_MARGIN_S = 1.5  # wait(timeout=T) while the server is down raises within T + this
# the subprocess worker's log lines (timed: a failure prints them beside the server's)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class In(BaseModel):
    n: int = 0


def _bump(run_id: str, step: str) -> int:
    with (Path(os.environ["WFE_TEST_COUNT_DIR"]) / f"{run_id}-{step}").open("a") as f:
        f.write("1\n")
    return 1


def build_registry() -> Registry:
    wf = Workflow("restarts", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return int(await ctx.step.run("ax", _bump, ctx.run_id, "ax"))

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        await ctx.step.run("bx", _bump, ctx.run_id, "bx")
        got = await ctx.step.wait_for_signal("go")
        await ctx.step.sleep("nap", 0.5)
        await ctx.step.run("by", _bump, ctx.run_id, "by")
        return int(got["n"])

    return Registry([wf])


class RestartableServer(TemporalDevServer):
    """A dev server (state in a database file) the test stops with a signal of its choice."""

    async def down(self, sig: signal.Signals) -> None:
        proc = self._proc
        assert proc is not None and proc.poll() is None
        proc.send_signal(sig)
        await asyncio.to_thread(proc.wait, 15)
        await self.stop()  # (forgets the exited process, closes its log)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[RestartableServer]:
    srv = RestartableServer(
        db_filename=tmp_path / "temporal.db", headless=True, log_file=tmp_path / "server.log"
    )
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


def _count(counts: Path, run_id: str, step: str) -> int:
    p = counts / f"{run_id}-{step}"
    return len(p.read_text().splitlines()) if p.exists() else 0


async def _signal_soon(engine: Any, run_id: str, deadline_s: float = RECOVER_S) -> None:
    """A signal as an operator's client sends it after a restart: retried while the server
    says it is unavailable (typed), until a deadline."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            await engine.signal(run_id, "go", {"n": 1})
            return
        except DriverUnavailableError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.2)


async def _finish(engine: Any, batch: list[str], signalled: int = 0) -> None:
    """Signals the runs of ``batch`` (but its first ``signalled``) once the server is back,
    then waits for them all to end, in a bounded time."""
    t0 = time.monotonic()
    for run_id in batch[signalled:]:
        await _signal_soon(engine, run_id)
    for run_id in batch:
        try:
            info = await engine.wait(run_id, timeout=RECOVER_S)
        except Exception as exc:
            raise AssertionError(f"{exc!r}\n{await _diagnosis(engine, batch, t0)}") from exc
        assert info.status == "completed", info
    if (took := time.monotonic() - t0) >= RECOVER_S:
        raise AssertionError(f"took {took:.1f}s\n{await _diagnosis(engine, batch, t0)}")


async def _diagnosis(engine: Any, runs: list[str], t0: float) -> str:
    """For a failure message: what the runs of a batch that did not end in time were doing
    (each one's status; but for a completed one, its pending workflow task and activities and
    its history) and which task queue types Temporal lists for their Worker Deployment version
    (one missing: Temporal refuses those polls)."""
    out = [f"{time.monotonic() - t0:.1f}s after the server answered again"]
    try:
        out.append(f"version's task queue types: {await _version_types(engine)}")
    except Exception as exc:
        out.append(f"version not described: {exc!r}")
    for run_id in runs:
        try:
            out += await _run_diagnosis(engine, run_id)
        except Exception as exc:
            out.append(f"run {run_id}: not described ({exc!r})")
    return "\n".join(out)


async def _run_diagnosis(engine: Any, run_id: str) -> list[str]:
    handle = engine._conn.get_workflow_handle(run_id)
    desc = await asyncio.wait_for(handle.describe(), 10)
    raw = desc.raw_description
    out = [f"run {run_id}: {desc.status.name if desc.status else '?'}"]
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        return out
    if raw.HasField("pending_workflow_task"):
        wt = raw.pending_workflow_task
        out.append(
            f"  pending workflow task: state={wt.state} attempt={wt.attempt} "
            f"scheduled={wt.scheduled_time.ToDatetime():%H:%M:%S.%f}"
        )
    for pa in raw.pending_activities:
        out.append(
            f"  pending activity {pa.activity_type.name} (id {pa.activity_id}): state={pa.state} "
            f"attempt={pa.attempt} last failure {pa.last_failure.message!r}"
        )
    for ev in (await asyncio.wait_for(handle.fetch_history(), 10)).events:
        kind = ev.WhichOneof("attributes") or ""
        detail = ""
        if "timed_out" in kind or "failed" in kind:
            detail = str(getattr(ev, kind)).replace("\n", " ")[:200]
        elif kind == "activity_task_scheduled_event_attributes":
            detail = ev.activity_task_scheduled_event_attributes.activity_type.name
        out.append(
            f"  {ev.event_id:3d} {ev.event_time.ToDatetime():%H:%M:%S.%f} "
            f"{kind.removesuffix('_event_attributes')} {detail}"
        )
    return out


async def _version_types(engine: Any) -> list[str]:
    """The task queue types Temporal lists for the registry's one version (its queue)."""
    ((wf_id, version),) = engine.registry.served()
    dv = engine.deployment_version(wf_id, version)
    req = DescribeWorkerDeploymentVersionRequest(
        namespace=engine.settings.temporal_namespace,
        deployment_version=PbDeploymentVersion(
            deployment_name=dv.deployment_name, build_id=dv.build_id
        ),
    )
    desc = await engine._conn.workflow_service.describe_worker_deployment_version(
        req, timeout=timedelta(seconds=5)
    )
    tq = engine.task_queue(wf_id)
    return sorted(
        TaskQueueType.Name(t.type)
        for t in desc.worker_deployment_version_info.task_queue_infos
        if t.name == tq
    )


async def _version_settled(engine: Any) -> None:
    """Until Temporal is done setting up the workers' new Worker Deployment version: the
    queue registered as the version for workflow and activity tasks (each by the first poll of
    its kind) and the version made current (``EngineWorker._make_current``), its routing
    propagated.

    Temporal does that in its own system workflows, whose activities have a 1-minute
    start-to-close timeout and no heartbeat: a server stopped in the middle loses the
    attempt, and the version's polls of the type not registered yet are refused ("task queue
    is not ready to process polls from this deployment version") until that timeout passes,
    ~60 s later. Seen beside two CPU hogs, where this setup took over a second and the first
    restart came during it: the runs' activity retries waited for an activity poller past
    RECOVER_S (only eager activities, handed back with a workflow task, still ran). That is
    Temporal's recovery of its setup, not the driver's of its runs, which this test is about:
    the restarts come once it is done."""
    ((wf_id, version),) = engine.registry.served()
    deployment = engine.deployment_version(wf_id, version).deployment_name
    req = DescribeWorkerDeploymentRequest(
        namespace=engine.settings.temporal_namespace, deployment_name=deployment
    )
    deadline = time.monotonic() + SETTLE_S
    want = ["TASK_QUEUE_TYPE_ACTIVITY", "TASK_QUEUE_TYPE_WORKFLOW"]
    seen: Any = None
    while time.monotonic() < deadline:
        try:
            types = await _version_types(engine)
            info = (
                await engine._conn.workflow_service.describe_worker_deployment(
                    req, timeout=timedelta(seconds=5)
                )
            ).worker_deployment_info
        except RPCError as exc:  # (not found before the first poll's registration)
            seen = exc
        else:
            routing = info.routing_config.current_deployment_version.build_id
            state = info.routing_config_update_state
            seen = (types, routing, RoutingConfigUpdateState.Name(state))
            if (
                types == want
                and routing == version
                and state != RoutingConfigUpdateState.ROUTING_CONFIG_UPDATE_STATE_IN_PROGRESS
            ):
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"Temporal did not set up version {version} in {SETTLE_S:g}s: {seen}")


async def _restart(engine: Any, server: RestartableServer, sig: signal.Signals) -> list[str]:
    """Runs in flight while the server is stopped with ``sig`` and started again at once."""
    batch = [(await engine.start("restarts", {})).id for _ in range(3)]
    await engine.signal(batch[0], "go", {"n": 1})
    await server.down(sig)
    await asyncio.sleep(1.0)  # down ~1-2 s, as a restart is
    await server.start()
    await _finish(engine, batch, signalled=1)
    return batch


async def _outage(
    engine: Any, server: RestartableServer, proc: asyncio.subprocess.Process
) -> list[str]:
    """Runs in flight while the server is down 8-15 s (at least as long as the calls below
    take); every client call meanwhile raises DriverUnavailableError within a bound, saying
    what to do."""
    batch = [(await engine.start("restarts", {})).id for _ in range(3)]
    await server.down(signal.SIGKILL)
    down_at = time.monotonic()
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "start": lambda: engine.start("restarts", {}),
        "signal": lambda: engine.signal(batch[0], "go", {"n": 1}),
        "get_run": lambda: engine.get_run(batch[1]),
        "wait": lambda: engine.wait(batch[2], timeout=2.0),
        "wait0": lambda: engine.wait(batch[2], timeout=0),
        "list_runs": engine.list_runs,
    }
    # the caller's timeout holds, the server answering or not (temporalio alone retries a
    # describe ~10 s: wait(timeout=2) took 10-15 s)
    bounds = {"wait": 2.0 + WAIT_MARGIN_S, "wait0": WAIT_MARGIN_S}

    async def down_call(name: str) -> tuple[str, BaseException | None, float]:
        t = time.monotonic()
        try:
            await asyncio.wait_for(calls[name](), DOWN_CALL_S)
        except BaseException as exc:
            return name, exc, time.monotonic() - t
        return name, None, time.monotonic() - t

    for name, exc, took in await asyncio.gather(*(down_call(n) for n in calls)):
        assert isinstance(exc, DriverUnavailableError), (name, repr(exc), took)
        assert "check that the Temporal server is running" in str(exc), (name, exc)
        assert took < bounds.get(name, DOWN_CALL_S), (name, took, exc)
    while time.monotonic() - down_at < 8.0:  # (a deadline, checked every tick)
        assert proc.returncode is None, "the worker process exited while Temporal was down"
        await asyncio.sleep(0.5)
    await server.start()
    await _finish(engine, batch)
    return batch


async def _check_runs(engine: Any, sink: FileSink, counts: Path, runs: list[str]) -> None:
    """No attempt charged, no journaled step run twice, events complete with stable ids."""
    for run_id in runs:
        info = await engine.get_run(run_id)
        assert [(s.id, s.status, s.attempt) for s in info.stages] == [
            ("a", "completed", 1),
            ("b", "completed", 1),
        ], info
        for step in ("ax", "bx", "by"):
            assert _count(counts, run_id, step) == 1, (run_id, step)
        events = sink.events(run_id)  # deduplicated by id
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        types = [e.type for e in events]
        assert "stage.failed" not in types and types[-1] == "run.completed", types


async def _worker_up(proc: asyncio.subprocess.Process, log: Path, timeout: float = 30.0) -> None:
    """Until the subprocess worker polls (its banner), before the server goes down."""
    deadline = time.monotonic() + timeout
    while "wfe worker (temporal)" not in (text := await asyncio.to_thread(log.read_text)):
        assert proc.returncode is None, text[-3000:]
        assert time.monotonic() < deadline, "the worker process did not start"
        await asyncio.sleep(0.1)


def _print_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The logs of a failed test, timed: the worker process's, the server's (but its retried
    dials and polls while it restarts) and this process's."""
    print("--- worker.log (tail)\n" + (tmp_path / "worker.log").read_text(errors="replace")[-6000:])
    server = (tmp_path / "server.log").read_text(errors="replace").splitlines()
    noise = ("network dial error", "Failed to poll for task")
    print(
        "--- server.log",
        *[x[:600] for x in server if not any(n in x for n in noise)][-40:],
        sep="\n",
    )
    print("--- this process's log")
    for r in caplog.records:
        if r.name.startswith("wfe.temporal") or r.levelno >= logging.WARNING:
            at = time.strftime("%H:%M:%S", time.localtime(r.created))
            print(f"{at}.{int(r.msecs):03d} {r.levelname} {r.name}: {r.getMessage()}")


def _outage_logs(lines: list[str]) -> tuple[int, int, list[str]]:
    """The outage WARNINGs and recovery INFOs among a process's log lines, and the retry WARNs
    of temporalio's core (one per retried call: dozens an outage, 1-2 a second)."""
    warned = [x for x in lines if "WARNING wfe.temporal: " in x and "does not answer" in x]
    back = [x for x in lines if "INFO wfe.temporal: Temporal answers again" in x]
    retried = [x for x in lines if "retried" in x and "gRPC call" in x]
    return len(warned), len(back), retried


def _check_outage_logs(lines: list[str], who: str) -> None:
    """Each outage (one 8 s, two 1-2 s restarts) logged once and its end once, no retry."""
    warned, back, retried = _outage_logs(lines)
    assert not retried, (who, len(retried), retried[:3])
    assert 1 <= warned <= 3 and back == warned, (who, warned, back, lines[-30:])


async def test_runs_survive_server_restarts_and_outage(
    server: RestartableServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="wfe.temporal")
    counts, blobs = tmp_path / "counts", tmp_path / "blobs"
    counts.mkdir()
    sink = FileSink(tmp_path / "events.jsonl")
    settings = EngineSettings(
        driver="temporal",
        temporal_address=server.address,
        task_queue=f"restart-{os.getpid()}",
        blob_url=f"file://{blobs}",
    )
    monkeypatch.setenv("WFE_TEST_COUNT_DIR", str(counts))
    engine = create_temporal_engine(
        settings,
        build_registry(),
        event_sink=sink,
        blob_store=FolderBlobStore(blobs),
        heartbeat_timeout=3.0,
        unavailable_timeout=5.0,
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WFE_TEMPORAL_ADDRESS": server.address,
        "WFE_TASK_QUEUE": settings.task_queue,
        "WFE_BLOB_URL": f"file://{blobs}",
        "WFE_TEST_EVENTS": str(tmp_path / "events.jsonl"),
    }
    worker_log = tmp_path / "worker.log"
    with worker_log.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.temporal.test_server_restart",
            env=env,
            cwd=str(ROOT),
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    runs: list[str] = []
    try:
        await _worker_up(proc, worker_log)
        async with engine, engine.worker(sticky_queue_timeout=2.0):
            await _version_settled(engine)  # (Temporal's setup of the version, done)
            for scenario in (signal.SIGTERM, signal.SIGKILL):
                runs += await _restart(engine, server, scenario)
            runs += await _outage(engine, server, proc)
            await _check_runs(engine, sink, counts, runs)
        assert proc.returncode is None, "the worker process exited"
    except BaseException:
        _print_logs(tmp_path, caplog)  # (pytest shows them with the failure)
        raise
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    text = worker_log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert len(text.splitlines()) < 300, f"{len(text.splitlines())} log lines: {text[-3000:]}"
    _check_outage_logs(text.splitlines(), "the worker process")
    mine = [
        f"{r.levelname} {r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.name.startswith("wfe.temporal")
    ]
    _check_outage_logs(mine, "this process")


def test_outage_filter_keeps_other_core_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Only the core's retry WARNs of an unavailable server are dropped (one WARNING for the
    lot); any other core message goes through as it is."""
    caplog.set_level(logging.INFO, logger="wfe.temporal")
    outage = OutageFilter()

    def core(message: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord(CORE_LOGGER, level, "(sdk-core)", 0, message, (), None)

    refused = (
        "[sdk_core::temporalio_client::retry] gRPC call poll_workflow_task_queue retried 6 "
        "times {'error': 'Status { code: Unavailable, message: \"tcp connect error\", source: "
        'Some(tonic::transport::Error(Transport, ConnectError(ConnectError("tcp connect '
        "error\", 127.0.0.1:7233, Os { code: 111 }))))) }'}"
    )
    others = [
        core(refused.replace("Unavailable", "Internal")),
        core(refused.replace("Unavailable", "Unknown")),  # (Unknown: only "transport error")
        core("[sdk_core::temporalio_sdk_core::worker] Failed to complete workflow task"),
        core("[sdk_core::temporalio_client::retry] something else Unavailable", logging.ERROR),
    ]
    assert [outage.filter(r) for r in others] == [True] * 4
    assert [outage.filter(core(refused)) for _ in range(20)] == [False] * 20
    assert outage.filter(others[2]) is True  # (during an outage too)
    outage.answered()
    outage.answered()
    reset = refused.replace('Unavailable, message: "tcp connect', 'Unknown, message: "transport')
    assert "Unknown" in reset and not outage.filter(core(reset))  # a second outage: cut
    outage.answered()
    closed = (  # a long poll the restarting server closed (seen beside a CPU hog)
        "[sdk_core::temporalio_client::retry] gRPC call poll_activity_task_queue retried 6 "
        "times {'error': 'Status { code: Cancelled, message: \"operation was canceled\", "
        'source: Some(tonic::transport::Error(Transport, hyper::Error(Canceled, "connection '
        "closed\"))) }'}"
    )
    assert not outage.filter(core(closed))  # a third outage
    assert outage.filter(core(closed.replace("tonic::transport::Error", "Other"))) is True
    lines = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records]
    warned, back, _ = _outage_logs(lines)
    assert (warned, back) == (3, 2), lines
    assert "Temporal at 127.0.0.1:7233 does not answer" in lines[0], lines


async def _worker_main() -> None:
    from driver_temporal import run_worker_forever

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # (as `wfe worker` logs)
    logging.getLogger("wfe").setLevel(logging.WARNING)  # (but its runs' INFO lines)
    logging.getLogger("wfe.temporal").setLevel(logging.INFO)
    settings = EngineSettings(driver="temporal")  # WFE_TEMPORAL_ADDRESS, WFE_TASK_QUEUE, ...
    engine = create_temporal_engine(
        settings,
        build_registry(),
        event_sink=FileSink(Path(os.environ["WFE_TEST_EVENTS"])),
        blob_store=FolderBlobStore(settings.blob_url.reveal().removeprefix("file://")),
        heartbeat_timeout=3.0,
    )
    await run_worker_forever(engine, sticky_queue_timeout=2.0)


if __name__ == "__main__":
    asyncio.run(_worker_main())
