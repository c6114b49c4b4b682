"""`wfe ui` as a user starts it: a process serving the view on loopback, read-only by default."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

import wfe_ui
from engine_port import EngineSettings, create_engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_public_surface() -> None:
    assert wfe_ui.__all__ == ["BadRequestError", "create_app"]


def test_wfe_ui_serves_read_only_on_loopback(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    wfe = [sys.executable, "-m", "wfe_cli"]
    settings = EngineSettings(database_url=env["WFE_DATABASE_URL"], blob_url=env["WFE_BLOB_URL"])
    asyncio.run(create_engine(settings, None).connect())  # creates the schema, as db upgrade
    port = free_port()
    proc = subprocess.Popen(
        [*wfe, "ui", "--port", str(port), "--app", "wfe_cli._demo:build_demo"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                page = httpx2.get(url + "/runs")
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline, "wfe ui did not answer in 30s"
                time.sleep(0.1)
        assert page.status_code == 200 and "No runs match." in page.text
        assert "read-only" in page.text
        versions = httpx2.get(url + "/versions").text
        assert "demo-order" in versions  # --app: the served versions
        refused = httpx2.post(url + "/runs/some-run/cancel")
        assert refused.status_code == 403 and "--allow-actions" in refused.text
        # a page asked for under another host name (DNS rebinding) is refused
        rebound = httpx2.get(url + "/runs", headers={"host": "attacker.example"})
        assert rebound.status_code == 400
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.stderr is not None
    assert f"wfe ui on http://127.0.0.1:{port}/" in proc.stderr.read()


def test_wfe_ui_on_a_database_without_the_schema_says_what_to_do(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "wfe_cli", "ui", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 5
    assert "wfe db upgrade" in done.stderr
    assert not (tmp_path / "wfe.db").exists() or (tmp_path / "wfe.db").stat().st_size == 0


@pytest.mark.parametrize("port", ["0", "70000"])
def test_bad_port_is_a_usage_error(port: str) -> None:
    from typer.testing import CliRunner

    from wfe_cli import app

    result = CliRunner().invoke(app, ["ui", "--port", port])
    assert result.exit_code == 2
