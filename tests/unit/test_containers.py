"""Which servers the tests and ``wfe conformance`` use: the local ones unless
``--containers`` is given; then Docker and testcontainers are required (a clear error, never
a silent fallback). This machine has no Docker: the container path itself is not run here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conformance._containers import (
    ContainerServers,
    choose_servers,
    docker_problem,
    temporal_command,
)
from engine_port.errors import ConfigurationError
from wfe_cli import EXIT_CODES, app

ROOT = Path(__file__).resolve().parents[2]
NO_DOCKER = docker_problem() is not None


def test_local_servers_unless_containers_are_asked_for() -> None:
    assert choose_servers(False, problem=lambda: "no Docker", installed=lambda: False) == "local"
    assert choose_servers(True, problem=lambda: None, installed=lambda: True) == "containers"


def test_containers_without_docker_or_testcontainers_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"--containers needs Docker \(no socket\)"):
        choose_servers(True, problem=lambda: "no socket", installed=lambda: True)
    with pytest.raises(ConfigurationError, match=r"wfe\[containers\]"):
        choose_servers(True, problem=lambda: None, installed=lambda: False)


def test_docker_is_found_by_docker_host_or_its_socket(tmp_path: Path) -> None:
    missing = tmp_path / "docker.sock"
    assert "DOCKER_HOST is not set" in str(docker_problem({}, missing))
    assert docker_problem({"DOCKER_HOST": "tcp://docker:2375"}, missing) is None
    missing.touch()
    assert docker_problem({}, missing) is None


def test_container_servers_point_the_settings_and_the_tests_at_them() -> None:
    servers = ContainerServers(
        postgres_url="postgresql+psycopg://u:p@127.0.0.1:32768/test",
        s3_endpoint="127.0.0.1:32769",
        s3_access_key="ak",
        s3_secret_key="sk-secret",
        temporal_address="127.0.0.1:32770",
    )
    native = servers.settings_update("native")
    assert native["database_url"].reveal() == servers.postgres_url
    assert native["blob_url"].reveal().startswith("s3://wfe-")
    assert "endpoint=127.0.0.1:32769&access_key=ak&secret_key=sk-secret" in str(
        native["blob_url"].reveal()
    )
    temporal = servers.settings_update("temporal")
    assert temporal["temporal_address"] == "127.0.0.1:32770" and "database_url" not in temporal
    assert set(servers.test_env()) == {
        "WFE_TEST_POSTGRES_URL",
        "WFE_TEST_S3_ENDPOINT",
        "WFE_TEST_S3_ACCESS_KEY",
        "WFE_TEST_S3_SECRET_KEY",
        "WFE_TEST_TEMPORAL_ADDRESS",
    }


def test_the_temporal_container_runs_the_dev_server_with_wfes_search_attributes() -> None:
    from driver_temporal import SEARCH_ATTRIBUTES

    cmd = temporal_command(SEARCH_ATTRIBUTES)
    assert cmd[:2] == ["server", "start-dev"] and "0.0.0.0" in cmd
    for name in SEARCH_ATTRIBUTES:
        assert f"{name}=Keyword" in cmd


@pytest.mark.skipif(not NO_DOCKER, reason="this machine has Docker")
def test_wfe_conformance_containers_without_docker_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["conformance", "--containers", "-k", "s1_linear"])
    assert result.exit_code == EXIT_CODES["bad_config"]
    assert "--containers needs Docker" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not NO_DOCKER, reason="this machine has Docker")
def test_pytest_containers_without_docker_is_a_usage_error() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--containers",
            "-p",
            "no:cacheprovider",
            "tests/unit/test_containers.py::test_local_servers_unless_containers_are_asked_for",
        ],
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "--containers needs Docker" in proc.stderr
