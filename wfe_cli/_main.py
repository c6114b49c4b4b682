"""The ``wfe`` command line: the root command and where each command group lives.

Results go to stdout (a table on a terminal; untruncated tab-separated rows when piped; one JSON
document, or JSON lines for listings, with ``--json``), errors to stderr, and the exit code says
what went wrong (``EXIT_CODES``, documented in the README).
"""

from __future__ import annotations

import importlib.metadata
import sys
from typing import Annotated, Any

import typer

from ._actions import cancel_cmd, purge_cmd, redrive_cmd, signal_cmd, start_cmd, wait_cmd
from ._conformance import conformance_cmd
from ._db import db_upgrade
from ._demo import demo
from ._dev import dev_temporal
from ._dlq import dlq_list, dlq_replay
from ._errors import guarded
from ._migrate import migrate_cmd
from ._runs import runs_cmd, show_cmd
from ._ui import ui_cmd
from ._versions import drain_cmd, versions_cmd
from ._worker import worker

__all__ = ["app", "build_app"]

HELP = "wfe: durable workflows on SQLite, PostgreSQL or Temporal."


def _version_callback(value: bool) -> None:
    if value:
        try:
            version = importlib.metadata.version("wfe")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        sys.stdout.write(f"wfe {version}\n")
        raise typer.Exit()


def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="print the version"
        ),
    ] = False,
) -> None:
    """wfe: durable workflows on SQLite, PostgreSQL or Temporal."""


def build_app() -> typer.Typer:
    """The ``wfe`` command with every command group (a new Typer app on each call)."""
    # (help texts as Markdown: Rich markup would take ``wfe[ui]`` in a help text for a style
    # tag and print ``wfe``, and would keep the docstrings' line breaks in the command list)
    kw: dict[str, Any] = {"no_args_is_help": True, "rich_markup_mode": "markdown"}
    app = typer.Typer(help=HELP, pretty_exceptions_enable=False, **kw)
    db_app = typer.Typer(help="Native driver database schema.", **kw)
    dev_app = typer.Typer(help="Development servers.", **kw)
    dlq_app = typer.Typer(help="Events the sink refused too often (dead letters).", **kw)
    app.add_typer(db_app, name="db")
    app.add_typer(dev_app, name="dev")
    app.add_typer(dlq_app, name="dlq")
    app.callback()(root)
    db_app.command("upgrade")(guarded(db_upgrade))
    dev_app.command("temporal")(guarded(dev_temporal))
    dlq_app.command("list")(guarded(dlq_list))
    dlq_app.command("replay")(guarded(dlq_replay))
    app.command("demo")(guarded(demo))
    app.command("worker")(guarded(worker))
    app.command("runs")(guarded(runs_cmd))
    app.command("show")(guarded(show_cmd))
    app.command("start")(guarded(start_cmd))
    app.command("wait")(guarded(wait_cmd))
    app.command("signal")(guarded(signal_cmd))
    app.command("cancel")(guarded(cancel_cmd))
    app.command("redrive")(guarded(redrive_cmd))
    app.command("versions")(guarded(versions_cmd))
    app.command("purge")(guarded(purge_cmd))
    app.command("drain")(guarded(drain_cmd))
    app.command("conformance")(guarded(conformance_cmd))
    app.command("migrate")(guarded(migrate_cmd))
    app.command("ui")(guarded(ui_cmd))
    return app


app = build_app()  # what `wfe` runs (_entry.main; tests invoke it with typer's CliRunner)
