"""``wfe migrate`` checks its arguments before it connects to anything: with the source
database unreachable (PostgreSQL on port 1) a wrong argument is reported
at once with its own message and exit code, never as "cannot reach the database" (exit 5)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wfe_cli import EXIT_CODES

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nowhere"


def _migrate(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WFE_")}
    env |= {
        "WFE_DATABASE_URL": UNREACHABLE,
        "WFE_DATABASE_RETRY_SECONDS": "5",  # a connection attempt: "cannot reach", exit 5
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "WFE_TEMPORAL_ADDRESS": "127.0.0.1:1",
        "COLUMNS": "300",
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "wfe_cli", "migrate", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--from", "native", "--to", "memory"], EXIT_CODES["bad_config"], "throwaway store"),
        (["--from", "memory", "--to", "native"], EXIT_CODES["bad_config"], "throwaway store"),
        (["--from", "native", "--to", "temporal", "--wait", "-1"], 2, "give 0 or more"),
        (
            [
                "--from",
                "native",
                "--to",
                "temporal",
                "--drain",
                "--workflow",
                "w",
                *["--drain-timeout", "-5"],
            ],
            2,
            "give 0 or more",
        ),
        (["--from", "native", "--to", "temporal", "--wait", "nan"], 2, "give 0 or more"),
        (["--from", "native", "--to", "native"], 2, "name the same driver"),
        (["--from", "native", "--to", "temporl"], EXIT_CODES["bad_config"], "--to 'temporl'"),
        (["--from", "native", "--to", "temporal", "--status", "bogus"], 2, "not a run status"),
    ],
)
def test_a_wrong_argument_is_reported_without_connecting(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    done, took = _migrate(tmp_path, *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "cannot reach" not in done.stderr
    assert took < 15  # the process start only
    assert done.stdout == ""
