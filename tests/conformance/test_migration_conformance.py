"""Moving live runs between engines: native on SQLite <-> native on PostgreSQL (two separate
databases sharing one blob folder), in both directions."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import Harness, MigrationContract, SettingsHarness
from engine_port import EngineSettings, Registry, RunStatus, create_engine, migrate_run
from engine_port.errors import MigrationError
from tests.integration.native import workflows as w
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


async def test_moving_a_run_into_the_database_it_is_in_is_refused(tmp_path: Path) -> None:
    """Two engines on one database: the import found the run being exported and took it for
    "already imported", so the run was marked migrated to where it was and never ran again.
    Now the import refuses, the export is aborted and the run goes on."""

    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'blobs'}"
    )
    registry = Registry([w.linear])
    async with create_engine(settings, registry) as one, create_engine(settings, registry) as two:
        run = await one.start("it-linear", {"n": 1})
        with pytest.raises(MigrationError, match="this very database"):
            await migrate_run(one, two, run.id)
        assert (await one.get_run(run.id)).status == RunStatus.PENDING
        async with one.worker():
            info = await one.wait(run.id, timeout=30)
    assert info.status == RunStatus.COMPLETED and info.output == {"result": 5}
