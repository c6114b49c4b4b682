"""``wfe migrate``: move live runs between drivers at safe points."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import Progress

from engine_port import MigrationReport, create_engine, migrate_runs

from ._errors import run_sync
from ._options import JsonOpt, settings, status_list
from ._output import console, errors, json_line, rows

__all__ = ["migrate_cmd"]


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
    statuses = status_list(status)
    source_settings, target_settings = settings(from_), settings(to)

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
