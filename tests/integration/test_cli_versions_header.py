"""``wfe versions`` on a database with no version yet prints the same header as with some: it
printed only ``workflow_id version``, so a script reading the columns by name broke on it."""

from __future__ import annotations

from typer.testing import CliRunner

from engine_port import VersionInfo
from wfe_cli import app


def test_an_empty_versions_listing_has_the_whole_header(env: dict[str, str]) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    result = runner.invoke(app, ["versions"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["\t".join(VersionInfo.model_fields)]
    assert "new_runs_to" in result.stdout
