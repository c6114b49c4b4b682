"""``wfe demo`` says what it runs on: the database only for the native driver. On the memory
driver it printed "engine: memory on sqlite:///.wfe/wfe.db" (a file it never used), and on the
Temporal driver the same instead of the cluster's address."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine_port import EngineSettings
from wfe_cli import app
from wfe_cli._demo import _where


def test_demo_on_the_memory_driver_names_no_database(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WFE_DRIVER", "memory")
    result = CliRunner().invoke(app, ["demo"], terminal_width=200)
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("engine: "))
    assert line.startswith("engine: memory") and "sqlite" not in line, line


def test_the_engine_line_names_what_each_driver_uses() -> None:
    native = EngineSettings(driver="native", database_url="postgresql+psycopg://u:pw@h:5432/db")
    assert _where(native) == "native on postgresql+psycopg://u:***@h:5432/db"
    temporal = EngineSettings(driver="temporal", temporal_address="t:7233")
    assert _where(temporal) == "temporal at t:7233 (namespace default)"
