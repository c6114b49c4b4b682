"""Commands that read or act on existing runs, pointed at a folder or database where no wfe
database exists, say so in one line and create nothing there (``wfe drain`` created an empty
database in the wrong folder, and so did every such command under a routing configuration)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from wfe_cli import EXIT_CODES, app

# every command that reads or acts on existing runs: none may create a database
READ_OR_OPERATE: dict[str, list[str]] = {
    "runs": ["runs"],
    "show": ["show", "r1"],
    "versions": ["versions"],
    "wait": ["wait", "r1", "--timeout", "1"],
    "signal": ["signal", "r1", "approval"],
    "cancel": ["cancel", "r1"],
    "redrive": ["redrive", "r1"],
    "purge": ["purge", "--older-than", "1d"],
    "drain": ["drain", "order", "--target", "memory"],
    "drain --lift": ["drain", "order", "--lift"],
    "dlq list": ["dlq", "list"],
    "dlq replay": ["dlq", "replay"],
    "ui": ["ui", "--port", "1"],  # (refused before it binds)
    "migrate": ["migrate", "--from", "native", "--to", "temporal", "--dry-run"],
}
# the commands that may create it: they start runs or serve them, or own a scratch area
MAY_CREATE = {"worker", "start", "demo", "db upgrade", "dev temporal", "conformance"}


def _commands(group: Any, prefix: str = "") -> set[str]:
    """The command paths under a (typer-built) command group: "runs", "dlq list", ..."""
    found: set[str] = set()
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found |= _commands(command, f"{prefix}{name} ")
        else:
            found.add(f"{prefix}{name}")
    return found


def test_every_command_is_either_checked_here_or_may_create_a_database() -> None:
    """A new command must be sorted into one of the two lists."""
    checked = {name.removesuffix(" --lift") for name in READ_OR_OPERATE}
    assert _commands(typer.main.get_command(app)) == checked | MAY_CREATE


@pytest.mark.parametrize("routes", [None, '{"other": "memory"}'], ids=["native", "routed"])
@pytest.mark.parametrize("command", list(READ_OR_OPERATE))
def test_a_command_on_existing_runs_creates_no_database_where_none_exists(
    command: str,
    routes: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pointed at a folder without a wfe database (the default ``.wfe/wfe.db`` under the
    current folder, or a URL naming a folder that does not exist), the command fails with
    one line saying there is no wfe database there and how to point at the right one."""
    monkeypatch.chdir(tmp_path)
    for name in ("WFE_DATABASE_URL", "WFE_BLOB_URL", "WFE_DRIVER", "WFE_APP", "WFE_ROUTES"):
        monkeypatch.delenv(name, raising=False)
    if routes is not None:
        monkeypatch.setenv("WFE_ROUTES", routes)
    runner = CliRunner()
    for url in (None, f"sqlite:///{tmp_path / 'elsewhere' / 'wfe.db'}"):
        if url is not None:
            monkeypatch.setenv("WFE_DATABASE_URL", url)
        result = runner.invoke(app, READ_OR_OPERATE[command])
        assert result.exit_code == EXIT_CODES["unavailable"], (url, result.output)
        assert "Traceback" not in result.stderr and result.stdout == "", result.output
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: there is no wfe database at "), lines[0]
        assert "point database_url" in lines[0] and "'wfe db upgrade'" in lines[0]
        assert list(tmp_path.iterdir()) == [], (url, list(tmp_path.rglob("*")))


@pytest.mark.postgres
def test_drain_on_a_postgres_schema_without_wfe_tables_creates_none(
    pg_session: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy as sa

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WFE_ROUTES", raising=False)
    url = pg_session.new_schema()  # type: ignore[attr-defined]
    monkeypatch.setenv("WFE_DATABASE_URL", url)
    result = CliRunner().invoke(app, ["drain", "order", "--target", "memory"])
    assert result.exit_code == EXIT_CODES["unavailable"], result.output
    assert "has no wfe tables" in result.stderr and "'wfe db upgrade'" in result.stderr
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == []
    engine.dispose()
