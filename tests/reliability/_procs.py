"""Worker subprocesses for the reliability tests (one module of this package each), and the
waits and counts the tests read from them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "WorkerProcs", "counts", "eventually"]

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcs:
    """Worker subprocesses running ``python -m <module> URL WORK`` (``dir_env`` names WORK in
    their environment too); always stopped in ``close`` (resumed first, if paused)."""

    def __init__(self, url: str, work: Path, module: str, dir_env: str) -> None:
        self.url = url
        self.work = work
        self.module = module
        self.dir_env = dir_env
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, url: str | None = None, **env: str) -> subprocess.Popen[bytes]:
        """A worker, not waited for (``wait_ready``)."""
        full = {**os.environ, "PYTHONPATH": str(ROOT), self.dir_env: str(self.work), **env}
        log = open(self.work / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", self.module, url or self.url, str(self.work)],
            cwd=ROOT,
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.work / f"ready-{proc.pid}").exists():
            if proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker not ready within {timeout}s:\n{self.logs()}")
            time.sleep(0.02)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.kill()
        proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.work.glob("worker-*.log"))
        )

    def close(self) -> None:
        (self.work / "stop").write_text("stop")
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused worker cannot stop
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


async def eventually(
    check: Callable[[], Awaitable[Any]],
    timeout: float,
    what: str,
    procs: WorkerProcs | None = None,
) -> Any:
    """``check()``'s first true value, polled until ``timeout`` (then AssertionError naming
    ``what``, with the workers' logs)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "" if procs is None else f":\n{procs.logs()}"
            raise AssertionError(f"{what} not reached within {timeout}s (last {value!r}){logs}")
        await asyncio.sleep(0.05)


def counts(work: Path) -> list[tuple[str, str, str]]:
    """The ``pid run what`` lines the workers appended to ``work/counts``."""
    path = work / "counts"
    if not path.exists():
        return []
    return [tuple(line.split(" ", 2)) for line in path.read_text().splitlines()]  # type: ignore[misc]
