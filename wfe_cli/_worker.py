"""``wfe worker``: a host process for the app's registry until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Annotated, Any

import typer

from engine_port import EngineMetrics, WorkflowEngine, attach_metrics, create_engine, serve_metrics

from ._errors import EXIT_CODES, reported, run_sync
from ._logging import configure_logging
from ._options import AppOpt, DriverOpt, app_registry, seconds, settings
from ._output import console, errors

__all__ = ["worker"]

LogLevelOpt = Annotated[
    str,
    typer.Option(
        "--log-level",
        envvar="WFE_LOG_LEVEL",
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (or WFE_LOG_LEVEL)",
    ),
]
LogFormatOpt = Annotated[
    str, typer.Option("--log-format", help="text, or json: one JSON object per line")
]

# host settings (issue 16): unset options keep EngineSettings (WFE_*, wfe.toml, defaults)
_HostTime = Annotated[str | None, typer.Option(help="a duration: 30s, 5m, 1h (README Hosts)")]
_HostCount = Annotated[int | None, typer.Option(min=1, help="a bound per tick (README Hosts)")]


def _host_settings(times: dict[str, str | None], counts: dict[str, Any]) -> dict[str, Any]:
    out = {k: seconds(v, "--" + k.replace("_", "-")) for k, v in times.items() if v}
    return out | {k: v for k, v in counts.items() if v is not None}


def worker(
    app_: AppOpt = None,
    driver: DriverOpt = None,
    log_level: LogLevelOpt = "INFO",
    log_format: LogFormatOpt = "text",
    retention: _HostTime = None,
    stale_lease_threshold: _HostTime = None,
    job_absolute_timeout: _HostTime = None,
    job_heartbeat_interval: _HostTime = None,
    max_claims_per_tick: _HostCount = None,
    max_suspended_checks_per_tick: _HostCount = None,
    max_outbox_flush_per_tick: _HostCount = None,
    serves: Annotated[str | None, typer.Option(help='"all": claim every version')] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="WFE_METRICS_PORT",
            min=0,
            help="serve Prometheus metrics on http://HOST:PORT/metrics (needs wfe[metrics])",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            envvar="WFE_METRICS_HOST",
            help="the address /metrics listens on (127.0.0.1: this host only)",
        ),
    ] = "0.0.0.0",
) -> None:
    """Run a worker for the app's registry until SIGINT/SIGTERM (graceful shutdown). It logs
    each stage attempt, suspension, failure and compensation to stderr. ``--retention 30d``
    purges finished runs older than that as it goes."""
    with reported():
        configure_logging(log_level, log_format)
    host = _host_settings(
        {
            "retention": retention,
            "stale_lease_threshold": stale_lease_threshold,
            "job_absolute_timeout": job_absolute_timeout,
            "job_heartbeat_interval": job_heartbeat_interval,
        },
        {
            "max_claims_per_tick": max_claims_per_tick,
            "max_suspended_checks_per_tick": max_suspended_checks_per_tick,
            "max_outbox_flush_per_tick": max_outbox_flush_per_tick,
            "serves": serves,
        },
    )
    configured = settings(driver, **host)
    registry = app_registry(app_, configured, required=True)
    assert registry is not None

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        up = False

        def say(message: str) -> None:
            # (stderr carries the log: with --log-format json, one JSON object per line)
            if log_format.strip().lower() == "json":
                logging.getLogger("wfe.worker").warning(message)
            else:
                errors.print(message, highlight=False)

        def on_signal() -> None:
            # the first signal stops gracefully; a second one (an impatient Ctrl-C while
            # stages finish, or while a down database is retried) stops at once: the
            # attempts it abandons are retried after their lease, as after a crash
            if stop.is_set():
                say("stopping now (second signal)")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_CODES["interrupted"])
            stop.set()
            what = "letting running stages finish" if up else "once the engine is up"
            say(f"stopping ({what}); Ctrl-C again to stop now")

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        async with contextlib.AsyncExitStack() as stack:
            engine = await stack.enter_async_context(create_engine(configured, registry))
            # metrics first: a port that cannot be served stops the worker before it claims
            stats = _LateStats()
            if metrics_port is not None:
                served = _metrics_served(engine, stats, metrics_port, metrics_host)
                port = await stack.enter_async_context(served)
                shown = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
                console.print(f"metrics on http://{shown}:{port}/metrics", highlight=False)
            stats.worker = await stack.enter_async_context(engine.worker())
            # its id, when the driver's worker has one: another host's takeover of a lease
            # it held names it by that id ("lease of worker HOST:PID:xxxxxx expired")
            worker_id = getattr(stats.worker, "worker_id", None)
            named = f", id={worker_id}" if worker_id else ""
            console.print(
                f"worker up: driver={configured.driver}{named}, "
                f"workflows={sorted(registry.served())}",
                highlight=False,
            )
            up = True
            await stop.wait()
        console.print("worker stopped")

    run_sync(serve())


class _LateStats:
    """The worker's ``stats()`` for its metrics, served before the worker is up (none yet)."""

    worker: Any = None

    def stats(self) -> Mapping[str, Any]:
        stats = getattr(self.worker, "stats", None)
        return {} if stats is None else stats()


def _metrics_served(
    engine: WorkflowEngine, worker: Any, port: int, addr: str
) -> AbstractAsyncContextManager[int]:
    """``wfe worker --metrics-port``: the worker's metrics on /metrics (issue 14)."""
    metrics = EngineMetrics()
    attach_metrics(engine, metrics)
    return serve_metrics(metrics, engine, worker, port, addr)
