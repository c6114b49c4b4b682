"""Prometheus metrics of a worker (optional extra ``wfe[metrics]``): ``wfe worker
--metrics-port N`` serves them on ``/metrics``.

Every :class:`EngineMetrics` has a registry of its own (never prometheus_client's global
default). The StageRunner reports each stage attempt and compensation through
:meth:`EngineMetrics.stage_outcome` (so both drivers count alike); :meth:`refresh` copies
what the worker and the database say (jobs claimed, lease takeovers, outbox, queue lag, runs
per status) where the driver tells it (native).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError

if TYPE_CHECKING:
    from ._graph import Stage
    from ._runner import Outcome, StageRequest

__all__ = ["METRIC_NAMES", "EngineMetrics", "attach_metrics", "serve_metrics"]

log = logging.getLogger("wfe.metrics")

REFRESH_INTERVAL_S = 1.0
"""How often a worker copies the database's and its own counts into its metrics."""

FIRST_REFRESH_TIMEOUT_S = 10.0
"""How long serving metrics waits for their first refresh (the database's gauges)."""

GAUGES_SHARE = 0.02
"""The most of the time a worker's metrics spend reading the database's gauges (runs per
workflow and status, queue lag): slow gauges are read less often than every refresh."""

METRIC_NAMES = (
    "wfe_stage_duration_seconds",
    "wfe_stage_attempts_total",
    "wfe_stage_failures_total",
    "wfe_stage_retries_total",
    "wfe_compensations_total",
    "wfe_runs",
    "wfe_jobs_claimed_total",
    "wfe_lease_takeovers_total",
    "wfe_outbox_pending",
    "wfe_dead_letters_total",
    "wfe_sink_degraded",
    "wfe_queue_lag_seconds",
    "wfe_database_retries_total",
)

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


def _client() -> Any:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        raise ConfigurationError(
            "metrics need prometheus-client: pip install 'wfe[metrics]'"
        ) from None


class EngineMetrics:
    """The ``wfe_*`` metrics of one worker, in a registry of their own (``.registry``)."""

    def __init__(self) -> None:
        pc = _client()
        self.registry = pc.CollectorRegistry(auto_describe=True)
        reg = self.registry
        stage = ["workflow", "stage"]
        self.stage_duration = pc.Histogram(
            "wfe_stage_duration_seconds",
            "How long stage attempts ran, by outcome (completed, failed, suspended, abandoned, "
            "cancelled)",
            [*stage, "outcome"],
            buckets=_BUCKETS,
            registry=reg,
        )
        self.attempts = pc.Counter(
            "wfe_stage_attempts", "Stage attempts executed (resumptions too)", stage, registry=reg
        )
        self.failures = pc.Counter(
            "wfe_stage_failures",
            "Stage attempts that failed (retried or for good)",
            [*stage, "error_type"],
            registry=reg,
        )
        self.retries = pc.Counter(
            "wfe_stage_retries", "Failed stage attempts that are retried", stage, registry=reg
        )
        self.compensations = pc.Counter(
            "wfe_compensations", "Compensation tries, by outcome", [*stage, "outcome"], registry=reg
        )
        self.runs = pc.Gauge(
            "wfe_runs",
            "Runs in the database by workflow and status (native)",
            ["workflow", "status"],
            registry=reg,
        )
        self.claimed = pc.Counter(
            "wfe_jobs_claimed", "Jobs this worker claimed (native)", registry=reg
        )
        self.takeovers = pc.Counter(
            "wfe_lease_takeovers",
            "Jobs this worker took over from a worker whose lease expired (native)",
            registry=reg,
        )
        self.outbox_pending = pc.Gauge(
            "wfe_outbox_pending",
            "Events not delivered to the sink yet (native: outbox rows pending or retrying)",
            registry=reg,
        )
        self.dead_letters = pc.Counter(
            "wfe_dead_letters", "Events this worker dead-lettered", registry=reg
        )
        self.sink_degraded = pc.Gauge(
            "wfe_sink_degraded",
            "1 while deliveries to the event sink fail and are retried, else 0",
            registry=reg,
        )
        self.queue_lag = pc.Gauge(
            "wfe_queue_lag_seconds",
            "How long the oldest due job has waited for a worker (native)",
            registry=reg,
        )
        self.db_retries = pc.Counter(
            "wfe_database_retries",
            "Transactions of the engine's database retried after a transient error (native)",
            registry=reg,
        )
        self._seen: dict[str, float] = {}
        self._runs_labels: set[tuple[str, str]] = set()

    # -- from the StageRunner ------------------------------------------------------------
    def stage_outcome(
        self,
        req: StageRequest,
        stage: Stage,
        outcome: Outcome | None,
        seconds: float,
        *,
        compensation: bool = False,
    ) -> None:
        """One attempt (or compensation try) ended with ``outcome`` (None: cancelled)."""
        from ._runner import Failed

        wf, sid = req.workflow.id, stage.id
        kind = "cancelled" if outcome is None else type(outcome).__name__.lower()
        if compensation:
            self.compensations.labels(wf, sid, kind).inc()
            return
        self.attempts.labels(wf, sid).inc()
        self.stage_duration.labels(wf, sid, kind).observe(seconds)
        if isinstance(outcome, Failed):
            self.failures.labels(wf, sid, outcome.error.type).inc()
            if outcome.retryable and req.attempt < stage.retry.max_attempts:
                self.retries.labels(wf, sid).inc()

    # -- from the worker and the database -----------------------------------------------
    def _advance(self, counter: Any, key: str, total: float) -> None:
        """Move ``counter`` up to a cumulative ``total`` the worker reports."""
        delta = total - self._seen.get(key, 0.0)
        if delta > 0:
            counter.inc(delta)
        self._seen[key] = max(total, self._seen.get(key, 0.0))

    async def refresh(self, engine: Any, worker: Any, *, gauges: bool = True) -> None:
        """Copy the worker's counts (``worker.stats()``) and (``gauges``) the database's
        gauges (``engine.gauges()``) where the driver has them."""
        stats: Mapping[str, Any] = worker.stats() if hasattr(worker, "stats") else {}
        if "claimed" in stats or "handed_off" in stats:
            total = float(stats.get("claimed", 0)) + float(stats.get("handed_off", 0))
            self._advance(self.claimed, "claimed", total)
        if "reaped_leases" in stats:
            self._advance(self.takeovers, "takeovers", float(stats["reaped_leases"]))
        if "database_retries" in stats:
            self._advance(self.db_retries, "db_retries", float(stats["database_retries"]))
        if "dead_lettered" in stats:
            self._advance(self.dead_letters, "dead", float(stats["dead_lettered"]))
        if "outbox_pending" in stats:
            pending = int(stats["outbox_pending"]) + int(stats.get("outbox_retrying", 0))
            self.outbox_pending.set(pending)
            self.sink_degraded.set(1 if int(stats.get("outbox_retrying", 0)) else 0)
        read = getattr(engine, "gauges", None)
        if read is None or not gauges:
            return
        now = await read()
        self.queue_lag.set(float(now["queue_lag_s"]))
        # set the new counts first, then drop the series gone since: /metrics is scraped from
        # another thread, and a clear() first showed a scrape no wfe_runs at all meanwhile
        counts = {(str(wf), str(status)): n for (wf, status), n in now["runs"].items()}
        for labels, n in counts.items():
            self.runs.labels(*labels).set(n)
        for labels in self._runs_labels - counts.keys():
            with contextlib.suppress(KeyError):
                self.runs.remove(*labels)
        self._runs_labels = set(counts)


def attach_metrics(engine: Any, metrics: EngineMetrics) -> None:
    """Make the StageRunner of a connected ``engine`` report to ``metrics``."""
    runner = getattr(engine, "runner", None)  # Temporal
    if runner is None:
        runner = getattr(getattr(engine, "kernel", None), "runner", None)  # native
    if runner is None:
        raise ConfigurationError(
            f"metrics are not supported by the {type(engine).__name__} engine; run one "
            "worker per driver (routes) to serve them"
        )
    runner.metrics = metrics


@contextlib.asynccontextmanager
async def serve_metrics(
    metrics: EngineMetrics,
    engine: Any,
    worker: Any,
    port: int,
    addr: str = "0.0.0.0",
    interval: float = REFRESH_INTERVAL_S,
) -> AsyncIterator[int]:
    """Serve ``metrics`` on ``http://addr:port/metrics`` (port 0: a free one, yielded) while
    refreshing them every ``interval`` seconds."""
    pc = _client()
    clock = asyncio.get_running_loop().time
    next_gauges = 0.0

    async def step() -> None:
        nonlocal next_gauges
        began = clock()
        with_gauges = began >= next_gauges
        try:
            await metrics.refresh(engine, worker, gauges=with_gauges)
        except Exception as exc:  # a missed refresh shows on the next one
            log.debug("metrics refresh failed: %s", exc)
        if with_gauges:
            # the database's gauges count every run (0.4 s at a million on SQLite):
            # read them at most GAUGES_SHARE of the time; the worker's counts are free
            next_gauges = began + max(interval, (clock() - began) / GAUGES_SHARE)

    async def refresh() -> None:
        while True:
            await asyncio.sleep(interval)
            await step()

    # the first refresh before the first scrape: served at once, /metrics showed no runs and
    # a queue lag of 0 (a backlog waiting) until the first read of the database ended
    with contextlib.suppress(TimeoutError):  # (a database that hangs: serve without)
        await asyncio.wait_for(step(), FIRST_REFRESH_TIMEOUT_S)
    try:
        server, thread = pc.start_http_server(port, addr=addr, registry=metrics.registry)
    except (OSError, OverflowError, ValueError) as exc:  # busy, or no port (70000, -1)
        raise ConfigurationError(
            f"cannot serve metrics on {addr}:{port} ({exc}); choose a free --metrics-port "
            "and a --metrics-host address of this machine"
        ) from None
    task = asyncio.create_task(refresh())
    try:
        yield int(server.server_address[1])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
