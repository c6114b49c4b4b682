"""``wfe migrate``: move live runs between drivers at safe points."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import Progress

from engine_port import MigrationReport, create_engine, migrate_runs
from engine_port.errors import ConfigurationError

from ._db import initialised
from ._errors import fail, reported, run_sync
from ._options import JsonOpt, driver_settings, status_list
from ._output import console, errors, json_line, rows

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
    as_json: JsonOpt = False,
) -> None:
    """Move live runs between drivers at safe points (rerunning it never duplicates a run)."""
    if from_ == to:
        raise typer.BadParameter("--from and --to name the same driver", param_hint="--to")
    if drain and dry_run:
        raise typer.BadParameter(
            "--drain moves runs; leave it out of a --dry-run", param_hint="--drain"
        )
    if drain and not workflow:
        raise typer.BadParameter(
            "say which workflows to drain (--workflow W)", param_hint="--drain"
        )
    statuses = status_list(status)
    source_settings = driver_settings(from_, "--from")
    target_settings = driver_settings(to, "--to")
    initialised(source_settings)  # never create an empty source database (a wrong folder)
    with reported():
        source = create_engine(source_settings, None)
        target = create_engine(target_settings, None)
    for engine, option in ((source, "--from"), (target, "--to")):
        if engine.driver_name in _THROWAWAY:
            # a run moved there would be marked migrated here and gone when the command ends
            what = (
                "a run moved there would be marked migrated here and lost"
                if option == "--to"
                else "it never holds a run another process started"
            )
            fail(
                ConfigurationError(
                    f"{option} {engine.driver_name}: that driver keeps runs only in the process "
                    f"that made them (a throwaway store), so {what}; migrate between drivers "
                    "that keep their runs (native, temporal)"
                )
            )

    async def move() -> MigrationReport:
        async with source, target:
            with Progress(console=errors, transient=True, disable=not errors.is_terminal) as bar:
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

    report = run_sync(move())
    if as_json:
        json_line(report)
        return
    title = f"{'dry run: ' if dry_run else ''}{from_} -> {to}"
    rows(
        ("run", "workflow", "outcome", "reason"),
        [(m.run_id, m.workflow_id, m.outcome, m.reason or "") for m in report.moves],
        title=title,
    )
    counts = (f"{o}: {report.count(o)}" for o in ("moved", "would_move", "skipped", "left"))
    console.print(", ".join(counts), highlight=False)
