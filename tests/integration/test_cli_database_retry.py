"""The CLI's own schema check (before any command on existing runs) and ``wfe db upgrade``
retry a database outage for ``database_retry_seconds``, as the engine does: they used the
driver's 10 s default whatever the setting said."""

from __future__ import annotations

import socket
import time

import pytest
from typer.testing import CliRunner

from wfe_cli import EXIT_CODES, app


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens there any more: connections are refused


@pytest.mark.parametrize("command", [["runs"], ["db", "upgrade"]], ids=["runs", "db upgrade"])
def test_an_unreachable_database_is_retried_for_database_retry_seconds(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("WFE_DRIVER", "WFE_APP", "WFE_ROUTES", "WFE_BLOB_URL"):
        monkeypatch.delenv(name, raising=False)
    url = f"postgresql+psycopg://wfe@127.0.0.1:{_closed_port()}/wfe"
    monkeypatch.setenv("WFE_DATABASE_URL", url)
    monkeypatch.setenv("WFE_DATABASE_RETRY_SECONDS", "0.5")
    began = time.monotonic()
    result = CliRunner().invoke(app, command)
    elapsed = time.monotonic() - began
    assert result.exit_code == EXIT_CODES["unavailable"], result.output
    assert "cannot reach the database" in result.stderr, result.stderr
    assert elapsed < 4, f"retried {elapsed:.1f}s, not database_retry_seconds=0.5"
