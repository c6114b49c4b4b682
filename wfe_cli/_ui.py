"""``wfe ui``: the web view of wfe_ui, served by uvicorn (the ``ui`` extra)."""

from __future__ import annotations

from typing import Annotated

import typer

from engine_port import create_engine
from engine_port.errors import ConfigurationError

from ._db import initialised
from ._errors import fail, reported
from ._options import AppOpt, DriverOpt, app_registry, settings
from ._output import errors

__all__ = ["ui_cmd"]

_LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "::1"]


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
        import uvicorn

        from wfe_ui import create_app
    except ImportError as exc:
        fail(ConfigurationError(f"wfe ui needs the 'ui' extra ({exc}): pip install 'wfe[ui]'"))
    configured = settings(driver)
    initialised(configured)
    registry = app_registry(app_, configured, required=False)
    with reported():
        engine = create_engine(configured, registry)
    loopback = host in ("127.0.0.1", "localhost", "::1")
    web = create_app(
        engine,
        registry=registry,
        allow_actions=allow_actions,
        allowed_hosts=_LOOPBACK_HOSTS if loopback else None,
    )
    shown = f"[{host}]" if ":" in host else host
    errors.print(
        f"wfe ui on http://{shown}:{port}/ (driver {configured.driver}, "
        f"{'actions allowed' if allow_actions else 'read-only'}); Ctrl-C stops it",
        highlight=False,
    )
    uvicorn.run(web, host=host, port=port, log_level="warning")
