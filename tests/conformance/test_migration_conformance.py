"""Moving live runs between engines: native on SQLite <-> native on PostgreSQL (two separate
databases sharing one blob folder), in both directions."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import Harness, MigrationContract, SettingsHarness
from engine_port import EngineSettings
from tests.support.databases import PostgresSession


@pytest.mark.postgres
class TestNativeToNativeMigration(MigrationContract):
    @pytest.fixture(params=["sqlite->postgres", "postgres->sqlite"])
    def migration_pair(
        self, request: pytest.FixtureRequest, pg_session: PostgresSession, tmp_path: Path
    ) -> tuple[Harness, Harness]:
        blobs = f"file://{tmp_path / 'blobs'}"
        sqlite = SettingsHarness(
            EngineSettings(
                database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=blobs, lease_seconds=3.0
            )
        )
        postgres = SettingsHarness(
            EngineSettings(database_url=pg_session.new_schema(), blob_url=blobs, lease_seconds=3.0)
        )
        return (sqlite, postgres) if request.param == "sqlite->postgres" else (postgres, sqlite)
