"""Fixtures of the command-line tests: a fresh SQLite engine in the test's folder, and wfe
processes started there and stopped at the end of the test."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CliProcess = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The embedded default in ``tmp_path`` (the current folder) through WFE_* variables."""
    values = {
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    return values


@pytest.fixture
def cli_process(env: dict[str, str], tmp_path: Path) -> Iterator[CliProcess]:
    """``cli_process("worker", "--app", "m", stderr=...)``: ``python -m wfe_cli ...`` in the
    test's folder with its settings (output as text, stdout piped, stderr into it unless
    given); killed at the end of the test if it is still running."""
    started: list[subprocess.Popen[str]] = []

    def start(
        *args: str, stdout: int = subprocess.PIPE, stderr: int = subprocess.STDOUT
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wfe_cli", *args],
            env={**os.environ, **env},
            stdout=stdout,
            stderr=stderr,
            text=True,
            cwd=tmp_path,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
