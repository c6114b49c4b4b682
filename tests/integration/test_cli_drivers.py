"""The CLI builds any installed driver and names the installed ones when asked for another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.entry_points import write_dist_info
from wfe_cli import app


@pytest.fixture(autouse=True)
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WFE_DATABASE_URL", f"sqlite:///{tmp_path / 'wfe.db'}")
    monkeypatch.setenv("WFE_BLOB_URL", f"file://{tmp_path / 'blobs'}")
    monkeypatch.chdir(tmp_path)


def test_an_unknown_driver_is_one_line_naming_the_installed_drivers() -> None:
    result = CliRunner().invoke(app, ["runs", "--driver", "oracle"], terminal_width=400)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    [line] = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "unknown driver 'oracle'" in line
    assert "memory, native, temporal" in line


def test_the_cli_builds_a_driver_installed_by_another_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    write_dist_info(site, "acme-wfe", {"acme": "driver_memory:create_memory_engine"})
    monkeypatch.syspath_prepend(str(site))
    result = CliRunner().invoke(app, ["runs", "--driver", "acme", "--json"])
    assert result.exit_code == 0, result.output
    assert [json.loads(ln) for ln in result.stdout.splitlines() if ln.strip()] == []
