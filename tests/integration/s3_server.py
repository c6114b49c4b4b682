"""An S3-compatible server for integration tests: moto's standalone server in a subprocess.

``MotoS3Server`` starts ``python -m moto.server`` on a free loopback port, polls it until it
answers HTTP (with a deadline, no fixed sleeps) and stops it again (terminate, then kill).
The session-scoped ``s3_server`` fixture yields its endpoint, ``"127.0.0.1:PORT"``; a test module
uses it by importing it (``from s3_server import s3_server``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import IO, Any

import pytest

__all__ = ["MotoS3Server", "free_port", "s3_server"]

HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback TCP port nothing is listening on (at the time of the call)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class MotoS3Server:
    def __init__(self, start_timeout: float = 30.0, stop_timeout: float = 10.0) -> None:
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def _answers_http(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/", timeout=1.0):
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP response (even an error status) means it is serving
        except OSError:
            return False

    def start(self) -> str:
        self.port = free_port()
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        proc = self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.start_timeout
        delay = 0.02
        while not self._answers_http():
            if proc.poll() is not None:
                output = self._output()
                self.stop()
                raise RuntimeError(
                    f"moto server exited with code {proc.returncode} before serving on "
                    f"{self.endpoint}:\n{output}"
                )
            if time.monotonic() > deadline:
                output = self._output()
                self.stop()
                raise RuntimeError(
                    f"moto server did not answer HTTP on {self.endpoint} within "
                    f"{self.start_timeout:.0f}s:\n{output}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
        return self.endpoint

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint ``"127.0.0.1:PORT"`` of a moto S3 server running for the whole session (or
    of the MinIO container that ``pytest --containers`` started)."""
    if os.environ.get("WFE_TEST_S3_ENDPOINT"):
        yield os.environ["WFE_TEST_S3_ENDPOINT"]
        return
    pytest.importorskip("moto.server", reason="needs moto[server] (pip install 'wfe[dev]')")
    with MotoS3Server() as endpoint:
        yield endpoint
