"""``wfe db upgrade``, and the check that commands acting on existing runs make first: on the
native driver the schema must be there and current (they never create a database)."""

from __future__ import annotations

from typing import Annotated

import typer

from engine_port import EngineSettings
from engine_port.errors import DriverUnavailableError

from ._errors import reported
from ._options import JsonOpt, settings
from ._output import console, json_line

__all__ = ["db_upgrade", "initialised"]


def initialised(settings: EngineSettings) -> None:
    """Commands that read or act on existing runs never create a database, a folder or a
    table: when the native driver serves them (configured, or named by a route of a routing
    engine) they first check that its database exists and its schema is there and current."""
    if "native" not in {settings.driver, *settings.routes.values()}:
        return
    from driver_native import Database

    with reported():
        db = Database(
            settings.database_url.reveal(),
            retry_seconds=settings.database_retry_seconds,
            create=False,
        )
        try:
            version, latest = db.schema_status()
            db.check_not_newer(version)
        finally:
            db.dispose()
        if version < latest:
            what = "has no wfe tables" if version == 0 else f"is at schema version {version}"
            raise DriverUnavailableError(
                f"the database at {settings.database_url} {what} (this wfe needs {latest}); "
                "run 'wfe db upgrade' first"
            )


def db_upgrade(
    database_url: Annotated[str | None, typer.Option()] = None, as_json: JsonOpt = False
) -> None:
    """Create or upgrade the native driver's schema."""
    configured = settings(database_url=database_url)
    from driver_native import Database

    with reported():
        db = Database(
            configured.database_url.reveal(), retry_seconds=configured.database_retry_seconds
        )
        try:
            applied = db.upgrade()
            version = db.schema_version()
        finally:
            db.dispose()
    if as_json:
        json_line({"schema_version": version, "applied": list(applied)})
    else:
        console.print(f"schema at version {version} (applied: {applied or 'none'})")
