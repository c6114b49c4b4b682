"""The conformance contract on the native driver: SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import AllContracts, SettingsHarness
from engine_port import EngineSettings
from tests.support.databases import PostgresSession


class TestNativeSqlite(AllContracts):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> SettingsHarness:
        settings = EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
            blob_url=f"file://{tmp_path / 'blobs'}",
            lease_seconds=3.0,
        )
        return SettingsHarness(settings, name="native-sqlite")


@pytest.mark.postgres
class TestNativePostgres(AllContracts):
    @pytest.fixture
    def harness(self, pg_session: PostgresSession, tmp_path: Path) -> SettingsHarness:
        settings = EngineSettings(
            driver="native",
            database_url=pg_session.new_schema(),
            blob_url=f"file://{tmp_path / 'blobs'}",
            lease_seconds=3.0,
        )
        return SettingsHarness(settings, name="native-postgres")
