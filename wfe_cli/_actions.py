"""``wfe signal``, ``wfe cancel``, ``wfe redrive`` and ``wfe purge``: commands that change
runs."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel

from engine_port import RunInfo, RunStatus, WorkflowEngine, create_engine
from engine_port.errors import WaitTimeoutError

from ._db import initialised
from ._errors import EXIT_CODES, run_sync
from ._options import AppOpt, DriverOpt, JsonOpt, RunIdArg, app_registry, resolve, seconds, settings
from ._output import console, error_line, json_line, show_json, when

__all__ = ["cancel_cmd", "purge_cmd", "redrive_cmd", "signal_cmd", "start_cmd", "wait_cmd"]

_WaitOpt = Annotated[
    str | None,
    typer.Option(
        "--wait",
        help="wait up to this long for the run to end (30, 5m, ...); exit 4 if it is still "
        "active then, 1 if it failed",
        show_default=False,
    ),
]


def start_cmd(
    workflow: Annotated[str, typer.Argument(help="the workflow id (its latest version)")],
    payload: Annotated[
        str,
        typer.Argument(help="the input as JSON; - reads it from stdin, @FILE from a file"),
    ] = "{}",
    app_: AppOpt = None,
    version: Annotated[
        str | None, typer.Option(help="start this version of the app's workflow")
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="a repeat with the same key returns the same run"),
    ] = None,
    wait: _WaitOpt = None,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a run of a workflow of the app (a worker serving its version runs it)."""
    value = _payload(payload)
    limit = None if wait is None else seconds(wait, "--wait")
    configured = settings(driver)
    registry = app_registry(app_, configured, required=True)

    async def start() -> RunInfo:
        async with create_engine(configured, registry) as engine:
            run = await engine.start(
                workflow, value, idempotency_key=idempotency_key, version=version
            )
            if limit is None:
                return run
            return await _waited(engine, run.id, limit)

    _ended(run_sync(start()), as_json, waited=limit is not None)


def wait_cmd(
    run_id: RunIdArg,
    timeout: Annotated[
        str, typer.Option("--timeout", help="how long to wait (30, 5m, ...)")
    ] = "60",
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait for a run to end and print it: exit 0 completed, 1 failed, 4 cancelled or still
    active after --timeout."""
    limit = seconds(timeout, "--timeout")
    configured = settings(driver)
    initialised(configured)

    async def wait() -> RunInfo:
        async with create_engine(configured, None) as engine:
            return await _waited(engine, await resolve(engine, run_id), limit)

    _ended(run_sync(wait()), as_json, waited=True)


async def _waited(engine: WorkflowEngine, run_id: str, limit: float) -> RunInfo:
    """The run once it ended, or as it is after ``limit`` seconds."""
    try:
        return await engine.wait(run_id, timeout=limit)
    except WaitTimeoutError:
        return await engine.get_run(run_id)


def _ended(info: RunInfo, as_json: bool, *, waited: bool) -> None:
    """Print the run; after a wait, exit with what its end means to a script."""
    if as_json:
        json_line(info)
    else:
        line = f"{info.id}: {info.status.value} (version {info.version})"
        if info.status == RunStatus.COMPLETED:
            line += f"; output {json.dumps(info.output, ensure_ascii=False)}"
        elif info.error is not None:
            line += f"; {info.error.type}: {info.error.message}"
        console.print(line, highlight=False, soft_wrap=True)
    if not waited or info.status == RunStatus.COMPLETED:
        return
    if info.status == RunStatus.FAILED:
        raise typer.Exit(1)
    if not info.terminal:
        # a run suspended on a signal, a timer or a poll needs that, not a worker (unless
        # its wait is over: then a worker resumes it)
        waiting = [s for s in info.stages if s.waiting_for]
        why = [
            f"{s.id} waits for {s.waiting_for}" + (f" until {when(s.wake_at)}" if s.wake_at else "")
            for s in waiting
        ]
        now = datetime.now(UTC)
        if not waiting or any(s.wake_at is not None and s.wake_at <= now for s in waiting):
            why.append("is a worker running for it?")
        error_line(f"run {info.id} is still {info.status.value}; {', '.join(why)}")
    raise typer.Exit(EXIT_CODES["wrong_state"])


def signal_cmd(
    run_id: RunIdArg,
    name: str,
    payload: Annotated[
        str,
        typer.Argument(
            help="the payload as JSON; - reads it from stdin, @FILE from a file (for a payload "
            "too large for a command line)"
        ),
    ] = "null",
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
    stage of the run's version declares is refused."""
    value = _payload(payload)
    configured = settings(driver)
    initialised(configured)
    registry = app_registry(app_, configured, required=False)

    async def send() -> BaseModel:
        async with create_engine(configured, registry) as engine:
            return await engine.signal(
                await resolve(engine, run_id), name, value, idempotency_key=idempotency_key
            )

    show_json(run_sync(send()), as_json)


def _payload(given: str) -> Any:
    """The JSON value of a payload argument: the text itself, ``-`` for stdin, ``@FILE``."""
    source = "the payload"
    text = given
    try:
        if given == "-":
            source = "the payload read from stdin"
            text = sys.stdin.read()
        elif given.startswith("@"):
            path = Path(given[1:]).expanduser()
            source = f"the payload in {str(path)!r}"
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        _bad(f"{source} cannot be read: there is no such file; check the path after @")
    except IsADirectoryError:
        _bad(f"{source} cannot be read: it is a folder; give a file after @")
    except UnicodeDecodeError:
        _bad(f"{source} is not UTF-8 text; save the JSON as UTF-8")
    except OSError as exc:
        _bad(f"{source} cannot be read: {exc.strerror or exc}")
    if not text.strip():
        _bad(f"{source} is empty; give JSON, e.g. '{{}}' or null")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        hint = "" if source != "the payload" else "; quote it, e.g. '{}' (or - for stdin, @FILE)"
        _bad(f"{source} is not JSON ({exc}){hint}")
    except RecursionError:
        _bad(f"{source} is nested too deeply to read")


def _bad(message: str) -> NoReturn:
    error_line(message)
    raise typer.Exit(EXIT_CODES["bad_input"])


def cancel_cmd(run_id: RunIdArg, driver: DriverOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a run (its completed stages are compensated)."""
    configured = settings(driver)
    initialised(configured)

    async def cancel() -> RunInfo:
        async with create_engine(configured, None) as engine:
            return await engine.cancel(await resolve(engine, run_id))

    info = run_sync(cancel())
    if as_json:
        json_line(info)
    else:
        console.print(f"{info.id}: {info.status.value}", highlight=False)


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
    reused); a worker serving its version then runs it. With --version, a pending or
    suspended run (stranded on a version no worker serves) is re-pinned to that version
    instead, nothing run again."""
    configured = settings(driver)
    initialised(configured)
    registry = app_registry(app_, configured, required=version is not None)

    async def redrive() -> RunInfo:
        async with create_engine(configured, registry) as engine:
            return await engine.redrive(await resolve(engine, run_id), from_, version=version)

    info = run_sync(redrive())
    if as_json:
        json_line(info)
    else:
        console.print(f"{info.id}: {info.status.value} (version {info.version})", highlight=False)


def purge_cmd(
    older_than: Annotated[
        str, typer.Option("--older-than", help="finished longer ago than this (30m, 12h, 7d)")
    ],
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished runs (their rows, events and blobs) older than a duration."""
    age = seconds(older_than, "--older-than")
    configured = settings(driver)
    initialised(configured)

    async def purge() -> int:
        async with create_engine(configured, None) as engine:
            return await engine.purge(age)

    count = run_sync(purge())
    if as_json:
        json_line({"purged": count})
    else:
        console.print(f"purged {count} run(s)")
