"""``wfe migrate``: move live runs between drivers at safe points."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.progress import Progress

from engine_port import (
    MigrationReport,
    RunMove,
    RunStatus,
    WorkflowEngine,
    abort_migration,
    create_engine,
    migrate_runs,
)
from engine_port.errors import ConfigurationError, RunNotFoundError

from ._db import initialised
from ._errors import EXIT_CODES, fail, reported, run_sync
from ._options import JsonOpt, driver_settings, resolve, status_list
from ._output import console, error_line, errors, json_line, rows

__all__ = ["migrate_cmd"]

# drivers whose runs live only as long as the engine object (nothing survives the command)
_THROWAWAY = frozenset({"memory"})


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
    abort: Annotated[
        bool,
        typer.Option(
            "--abort",
            help="unfreeze the --run runs an interrupted migration left frozen on --from",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Move live runs between drivers at safe points (rerunning it never duplicates a run)."""
    if from_ == to:
        raise typer.BadParameter("--from and --to name the same driver", param_hint="--to")
    if abort:
        _check_abort(run, dry_run=dry_run, drain=drain, selects=bool(workflow or version or status))
    _check_moving(
        dry_run=dry_run, drain=drain, workflow=workflow, wait=wait, drain_timeout=drain_timeout
    )
    statuses = status_list(status)
    # every argument is checked before anything connects to a database or Temporal server
    source_settings = driver_settings(from_, "--from")
    target_settings = driver_settings(to, "--to")
    _refuse_throwaway(source_settings.driver, "--from")
    _refuse_throwaway(target_settings.driver, "--to")
    initialised(source_settings)  # never create an empty source database (a wrong folder)
    with reported():
        source = create_engine(source_settings, None)
        target = create_engine(target_settings, None)
    _refuse_throwaway(source.driver_name, "--from")  # (a driver that is one under its name)
    _refuse_throwaway(target.driver_name, "--to")

    moves: list[RunMove] = []
    stopping = asyncio.Event()

    async def move() -> MigrationReport:
        async with source, target:
            with Progress(console=errors, transient=True, disable=not errors.is_terminal) as bar:
                task = bar.add_task(f"{from_} -> {to}", total=None)

                def moved(one: RunMove) -> None:
                    moves.append(one)
                    bar.advance(task)
                    if stopping.is_set():
                        raise _Stopped

                # (a unique prefix names a run here as in every other command: it was
                # "no run with id" here alone)
                run_ids = None if run is None else [await _full_id(source, r) for r in run]
                if abort:
                    return await abort_migration(source, target, run_ids or [])
                with _first_interrupt_stops(stopping):
                    try:
                        report = await migrate_runs(
                            source,
                            target,
                            workflow_ids=workflow,
                            version=version,
                            run_ids=run_ids,
                            statuses=statuses,
                            dry_run=dry_run,
                            drain=drain,
                            wait=wait,
                            drain_timeout=drain_timeout,
                            progress=moved,
                        )
                    except _Stopped:
                        report = MigrationReport(
                            source=source.driver_name, target=target.driver_name, dry_run=dry_run
                        )
                        report.moves = list(moves)
                        return report
                    report.moves += await _unselected(source, run_ids, report)
                    return report

    report = run_sync(move())
    if as_json:
        json_line(report)
        _exit_if_interrupted(stopping)
        return
    title = f"{'dry run: ' if dry_run else 'abort: ' if abort else ''}{from_} -> {to}"
    rows(
        ("run", "workflow", "outcome", "reason"),
        [(m.run_id, m.workflow_id, m.outcome, m.reason or "") for m in report.moves],
        title=title,
    )
    outcomes = ("unfrozen", "skipped") if abort else ("moved", "would_move", "skipped", "left")
    counts = (f"{o}: {report.count(o)}" for o in outcomes)
    console.print(", ".join(counts), highlight=False)
    _exit_if_interrupted(stopping)


async def _full_id(source: WorkflowEngine, run_id: str) -> str:
    """The id ``--run`` names on the source: itself, or the one run it is a prefix of."""
    return await resolve(source, run_id) if run_id.strip() else run_id


def _check_moving(
    *, dry_run: bool, drain: bool, workflow: list[str] | None, wait: float, drain_timeout: float
) -> None:
    if drain and dry_run:
        raise typer.BadParameter(
            "--drain moves runs; leave it out of a --dry-run", param_hint="--drain"
        )
    if drain and not workflow:
        raise typer.BadParameter(
            "say which workflows to drain (--workflow W)", param_hint="--drain"
        )
    for value, option in ((wait, "--wait"), (drain_timeout, "--drain-timeout")):
        if not value >= 0:  # (NaN too)
            raise typer.BadParameter(
                f"{value:g} is not a number of seconds; give 0 or more", param_hint=option
            )


def _check_abort(run: list[str] | None, *, dry_run: bool, drain: bool, selects: bool) -> None:
    """``--abort`` gives back the runs it names, and only those: it moves nothing."""
    if not run:
        raise typer.BadParameter(
            "name the runs to unfreeze with --run ID (the ids that signals, cancels or "
            "`wfe migrate` reported frozen)",
            param_hint="--abort",
        )
    if dry_run or drain or selects:
        raise typer.BadParameter(
            "--abort takes only --from, --to and --run (it moves nothing); leave out "
            "--dry-run, --drain, --workflow, --version and --status",
            param_hint="--abort",
        )


def _refuse_throwaway(driver: str, option: str) -> None:
    """Refuse a driver whose runs live only in this process on either side."""
    if driver not in _THROWAWAY:
        return
    # a run moved there would be marked migrated here and gone when the command ends
    what = (
        "a run moved there would be marked migrated here and lost"
        if option == "--to"
        else "it never holds a run another process started"
    )
    fail(
        ConfigurationError(
            f"{option} {driver}: that driver keeps runs only in the process that made them "
            f"(a throwaway store), so {what}; migrate between drivers that keep their runs "
            "(native, temporal)"
        )
    )


def _exit_if_interrupted(stopping: asyncio.Event) -> None:
    if stopping.is_set():
        error_line(
            "interrupted: the runs listed above are done; the others were not touched "
            "(run the same command again to move them)"
        )
        raise typer.Exit(EXIT_CODES["interrupted"])


class _Stopped(Exception):
    """The operator pressed Ctrl-C: stop once the run being moved has moved."""


@contextmanager
def _first_interrupt_stops(stopping: asyncio.Event) -> Iterator[None]:
    """The first Ctrl-C lets the run being moved finish its move (interrupting a move between
    the target's import and the source's mark left the run active on both drivers until the
    command was rerun), then stops; a second one interrupts at once."""
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        if stopping.is_set():
            loop.remove_signal_handler(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            return
        stopping.set()
        error_line("stopping after the run being moved (Ctrl-C again to interrupt now)")

    try:
        loop.add_signal_handler(signal.SIGINT, interrupt)
    except (NotImplementedError, RuntimeError):  # (no signal handlers here: Ctrl-C as before)
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _unselected(
    source: WorkflowEngine, run_ids: list[str] | None, report: MigrationReport
) -> list[RunMove]:
    """A row for each run named with ``--run`` that was not moved because it is not active
    (ended, or moved earlier): the table said "moved: 0" and nothing about why."""
    listed = {m.run_id for m in report.moves}
    extra = []
    for run_id in dict.fromkeys(run_ids or []):
        if run_id in listed:
            continue
        try:
            info = await source.get_run(run_id)
        except RunNotFoundError:
            continue
        if info.status == RunStatus.MIGRATED:
            reason = f"already moved to {info.migrated_to}"
        elif info.terminal:
            reason = f"{info.status.value} runs stay where they are"
        else:
            reason = f"{info.status.value}: not selected (--workflow, --version, --status)"
        extra.append(
            RunMove(run_id=run_id, workflow_id=info.workflow_id, outcome="skipped", reason=reason)
        )
    return extra
