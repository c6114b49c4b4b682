"""``wfe runs`` and ``wfe show``: reading runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.text import Text

from engine_port import RunInfo, WorkflowEngine, create_engine
from engine_port.errors import SpilledPayloadUnavailableError, UnsupportedFeatureError

from ._attempts import attempt_history
from ._db import initialised
from ._errors import fail, run_sync
from ._options import (
    MAX_LIMIT,
    AppOpt,
    DriverOpt,
    JsonOpt,
    RunIdArg,
    app_registry,
    resolve,
    seconds,
    settings,
    status_list,
)
from ._output import console, errors, json_line, plain, rows, show_json, when

__all__ = ["runs_cmd", "show_cmd"]


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
    limit: Annotated[int, typer.Option(min=1, max=MAX_LIMIT, help="at most this many runs")] = 20,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List recent runs, newest first."""
    statuses = status_list(status)
    cutoff = _created_after(seconds(since, "--since")) if since else None
    configured = settings(driver)
    initialised(configured)
    registry = app_registry(app_, configured, required=False)

    async def show() -> list[RunInfo]:
        async with create_engine(configured, registry) as engine:
            page = getattr(engine, "list_runs_page", None)
            if page is not None and (version is not None or cutoff is not None):
                # the database applies --version and --since: the newest ``limit`` runs that
                # match (a filter of the newest ``limit`` runs listed none of the v2 runs
                # older than the 20 newest runs of any version)
                found, _ = await page(
                    workflow_id=workflow,
                    status=statuses,
                    limit=limit,
                    version=version,
                    created_after=cutoff,
                    outputs=False,
                )
                return list(found)
            runs = await engine.list_runs(
                workflow_id=workflow, status=statuses, limit=limit, outputs=False
            )
        return [
            r
            for r in runs
            if (version is None or r.version == version)
            and (cutoff is None or r.created_at is None or r.created_at >= cutoff)
        ]

    runs = run_sync(show())
    if as_json:
        for r in runs:
            json_line(r)
        return
    rows(
        ("run", "workflow", "version", "status", "created", "updated", "stages"),
        [
            (
                r.id,
                r.workflow_id,
                r.version,
                f"{r.status.value} (frozen)" if r.frozen else r.status.value,
                when(r.created_at),
                when(r.updated_at),
                " ".join(f"{s.id}:{s.status.value}" for s in r.stages),
            )
            for r in runs
        ],
    )
    if workflow and not runs and not as_json:
        errors.print(f"no runs of workflow {workflow!r} match", highlight=False)


def _frozen_note(info: RunInfo, driver: str) -> str:
    """What ``wfe show`` says of a run frozen for a move: a migration that froze it and then
    stopped (killed, a host crash) leaves it so, refusing its signals and cancels, and
    nothing but finishing or aborting the move unfreezes it."""
    if driver == "routing":  # (the run is frozen on one of the drivers it routes to)
        driver = "SOURCE"
    return (
        f"frozen: run {info.id} is being moved to another driver (it runs no stage and "
        "takes no signal or cancel); if no migration is under way, "
        f"`wfe migrate --from {driver} --to TARGET --run {info.id}` finishes the move, "
        f"or the same command with --abort gives the run back to {driver}"
    )


def _created_after(age: float) -> datetime | None:
    """The creation time a run listed with ``--since`` is younger than (None: any run, for
    an age beyond the calendar, e.g. 99999999999d)."""
    try:
        return datetime.now(UTC) - timedelta(seconds=age)
    except (OverflowError, ValueError):
        return None


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
    configured = settings(driver)
    initialised(configured)

    async def show() -> dict[str, Any]:
        async with create_engine(configured, None) as engine:
            info, missing = await _readable_run(engine, await resolve(engine, run_id))
            out: dict[str, Any] = {"run": info, "missing": missing}
            out["driver"] = engine.driver_name
            if events:
                found = await _extra(engine, "events", info.id)
                out["attempts"] = attempt_history(found, info)
                out["events"] = found
            if steps:
                out["steps"] = await engine.steps(info.id)
            return out

    result = run_sync(show())
    missing: SpilledPayloadUnavailableError | None = result.pop("missing")
    driver_name: str = result.pop("driver")
    _print_run(result, events=events, steps=steps, as_json=as_json)
    if result["run"].frozen:  # (on stderr: stdout stays the run's JSON document)
        errors.print(_frozen_note(result["run"], driver_name), highlight=False)
    if missing is not None:  # shown without it: say what is gone, exit 1
        errors.print(
            "the run's values kept in the blob store are shown as null: one is missing",
            highlight=False,
        )
        fail(missing)


async def _readable_run(
    engine: WorkflowEngine, run_id: str
) -> tuple[RunInfo, SpilledPayloadUnavailableError | None]:
    """The run, and None; or, when a value it spilled is gone from the blob store (restore
    it, or fix blob_url, then redrive), the run without its spilled values (the driver's
    ``get_run_lazy``, as the web view reads it) and that error: the operator still sees its
    status, stages and error instead of the error alone."""
    try:
        return await engine.get_run(run_id), None
    except SpilledPayloadUnavailableError as exc:
        lazy = getattr(engine, "get_run_lazy", None)
        if lazy is None:
            raise
        info, _sizes = await lazy(run_id)
        return info, exc


def _print_run(result: dict[str, Any], *, events: bool, steps: bool, as_json: bool) -> None:
    if not (events or steps):
        show_json(result["run"], as_json)
        return
    if as_json or not console.is_terminal:
        json_line({k: plain(v) for k, v in result.items()})
        return
    show_json(result["run"], False)
    if events:
        _print_history(result)
    if steps:
        rows(
            ("stage", "step", "kind", "completed"),
            [(x.stage, x.name, x.kind, str(x.completed).lower()) for x in result["steps"]],
            title="steps",
        )


def _print_history(result: dict[str, Any]) -> None:
    rows(
        ("stage", "attempt", "started", "ended", "outcome", "error"),
        [
            (
                a.stage,
                str(a.attempt),
                when(a.started_at),
                when(a.ended_at),
                a.outcome,
                f"{a.error.type}: {a.error.message}" if a.error else "",
            )
            for a in result["attempts"]
        ],
        title="attempts",
    )
    for a in result["attempts"]:
        if a.error is not None and a.error.traceback:
            console.print(Text(f"{a.stage} attempt {a.attempt}", style="bold"))
            console.print(a.error.traceback, highlight=False)
    rows(
        ("seq", "at", "type", "stage", "data"),
        [
            (str(e.seq), when(e.at), e.type, e.stage or "", json.dumps(e.data))
            for e in result["events"]
        ],
        title="events",
    )


async def _extra(engine: WorkflowEngine, name: str, run_id: str) -> Any:
    """A driver's reading beyond the port: ``events`` (both shipped drivers list a run's
    events, the Temporal one from the workflow's history; a driver from another package or
    the routing engine may not). The journaled steps are the port's (``engine.steps``)."""
    method = getattr(engine, name, None)
    if method is None:
        raise UnsupportedFeatureError(
            f"the {engine.driver_name} driver does not list a run's {name}"
        )
    return await method(run_id)
