"""``wfe runs | head -1``: when the reader of stdout goes away, a command stops quietly (exit 1,
nothing on stderr), as it already did for what Rich prints. The tab-separated rows and JSON
lines written when piped said "error: unexpected BrokenPipeError ...; this is a bug"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _wfe(args: list[str], tmp_path: Path, stdout: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WFE_")}
    env["WFE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'wfe.db'}"
    env["WFE_BLOB_URL"] = f"file://{tmp_path / 'blobs'}"
    return subprocess.run(
        [sys.executable, "-m", "wfe_cli", *args],
        cwd=tmp_path,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [["runs"], ["db", "upgrade", "--json"]],  # (rows, then a JSON line)
    ids=["runs", "db upgrade --json"],
)
def test_a_reader_that_went_away_ends_the_command_quietly(args: list[str], tmp_path: Path) -> None:
    assert _wfe(["db", "upgrade"], tmp_path, subprocess.DEVNULL).returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes its first line
    try:
        result = _wfe(args, tmp_path, write_end)
    finally:
        os.close(write_end)
    assert result.stderr == "", result.stderr
    assert result.returncode == 1
