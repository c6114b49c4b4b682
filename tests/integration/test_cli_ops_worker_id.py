"""``wfe worker`` says which worker it is when it comes up: the takeover WARNING another host
logs after a crash names the dead worker by its id ("lease of worker HOST:PID:xxxxxx
expired"), an id no line of that worker's own log used to print."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.integration.conftest import CliProcess

APP = """
import asyncio
from pydantic import BaseModel
from engine_port import Registry, StageContext, Workflow


class In(BaseModel):
    pass


wf = Workflow("ops-id", input=In)


@wf.stage
async def slow(ctx: StageContext[In]) -> str:
    await asyncio.sleep(float(open("delay").read()))
    return "done"

registry = Registry([wf])
"""


class _Lines:
    """A process's output lines, read in a thread (no blocking reads in the test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.proc = proc
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(
            target=lambda: self.lines.extend(iter(out.readline, "")), daemon=True
        ).start()

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found
            if self.proc.poll() is not None and time.monotonic() + 0.5 < deadline:
                deadline = time.monotonic() + 0.5  # it exited: its last lines are read
            time.sleep(0.02)
        raise AssertionError(f"no line matching {pattern!r} in {self.lines}")


def test_the_takeover_warning_names_a_worker_its_own_log_announced(
    cli_process: CliProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "opsid.py").write_text(APP)
    (tmp_path / "delay").write_text("60")
    monkeypatch.setenv("WFE_STALE_LEASE_THRESHOLD", "2")
    first = cli_process("worker", "--app", "opsid:registry")
    first_out = _Lines(first)
    announced = first_out.wait_for(r"worker up: .*\bid=([^,\s]+)")[1]
    assert f":{first.pid}:" in announced

    started = cli_process("start", "ops-id", "{}", "--app", "opsid:registry")
    out, _ = started.communicate(timeout=60)
    assert started.returncode == 0, out
    run_id = out.split(":")[0].strip()
    first_out.wait_for(rf"run {run_id} ops-id/slow attempt 1: stage started")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)

    (tmp_path / "delay").write_text("0")
    second = cli_process("worker", "--app", "opsid:registry")
    took = _Lines(second).wait_for(
        r"lease of worker (\S+) expired .*serving (\S+) to claim", timeout=30
    )
    assert took[1] == announced
    # where the attempt runs again: a worker of its version (the reaper may serve none)
    assert took[2].startswith("ops-id@") and len(took[2]) > len("ops-id@"), took.group(0)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0
