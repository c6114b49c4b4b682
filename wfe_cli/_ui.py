"""``wfe ui``: the web view of wfe_ui, served by uvicorn (the ``ui`` extra)."""

from __future__ import annotations

import errno
import socket
from typing import Annotated

import typer

from engine_port import create_engine
from engine_port.errors import ConfigurationError

from ._db import initialised
from ._errors import EXIT_CODES, fail, reported
from ._options import AppOpt, DriverOpt, app_registry, settings
from ._output import error_line, errors

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
    bare = host.removeprefix("[").removesuffix("]")  # --host [::1] is ::1
    loopback = bare in ("127.0.0.1", "localhost", "::1")
    web = create_app(
        engine,
        registry=registry,
        allow_actions=allow_actions,
        allowed_hosts=_LOOPBACK_HOSTS if loopback else None,
    )
    # bind before saying where it serves: uvicorn reported a port in use or an unknown host
    # on its own log line after "wfe ui on ...", and exited 3 (wfe's "not found")
    sock = _listen(host, port)
    shown = f"[{bare}]" if ":" in bare else bare
    errors.print(
        f"wfe ui on http://{shown}:{port}/ (driver {configured.driver}, "
        f"{'actions allowed' if allow_actions else 'read-only'}); Ctrl-C stops it",
        highlight=False,
    )
    server = uvicorn.Server(uvicorn.Config(web, log_level="warning"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass  # Ctrl-C: uvicorn shut down gracefully and raised the signal again
    finally:
        sock.close()


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, or a one-line error saying what to change."""
    bare = host.removeprefix("[").removesuffix("]")
    try:
        found = socket.getaddrinfo(
            bare, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise typer.BadParameter(
            f"cannot listen on {host!r}: {exc}; give an address of this machine "
            "(127.0.0.1, ::1, 0.0.0.0 for every interface) or its name",
            param_hint="--host",
        ) from None
    family, kind, proto, _, address = found[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = "the port is in use (another wfe ui?); pick another --port"
        elif exc.errno in (errno.EACCES, errno.EPERM):
            why = "not allowed (ports below 1024 need privileges); pick another --port"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = "that address is not one of this machine's; pick another --host"
        else:
            why = f"{exc.strerror or exc}; pick another --host or --port"
        error_line(f"wfe ui cannot listen on {host}:{port}: {why}")
        raise typer.Exit(EXIT_CODES["unavailable"]) from None
    sock.set_inheritable(True)
    return sock
