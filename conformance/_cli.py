"""``wfe conformance``: run the contract against the configured engine (for example a team's
own PostgreSQL or Temporal cluster) and print a pass/fail table per scenario."""

from __future__ import annotations

import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

__all__ = ["run"]

# The settings reach the generated module through a fixture of an in-process plugin, never
# through the file: their URLs may carry passwords and keys (and dump redacted).
_TEST_MODULE = """
import pytest
from conformance import AllContracts, SettingsHarness


class TestConfiguredEngine(AllContracts):
    @pytest.fixture
    def harness(self, wfe_configured_settings):
        return SettingsHarness(wfe_configured_settings, name={name!r})
"""


class _SettingsPlugin:
    def __init__(self, settings: Any) -> None:
        self.settings = settings

    @pytest.fixture
    def wfe_configured_settings(self) -> Any:
        return self.settings


class _Collector:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, str]] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            name = report.nodeid.split("::")[-1]
            detail = ""
            if report.outcome == "failed":
                detail = str(report.longrepr).strip().splitlines()[-1][:120]
            elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
                detail = str(report.longrepr[2])[:120]
            self.rows.append((name, report.outcome, report.duration, detail))


def run(settings: Any, keyword: str | None, console: Console) -> int:
    with tempfile.TemporaryDirectory(prefix="wfe-conformance-") as tmp:
        # a fresh module name per run: a second run in one process must not meet the first
        module = Path(tmp) / f"test_wfe_conformance_{uuid.uuid4().hex[:12]}.py"
        module.write_text(textwrap.dedent(_TEST_MODULE.format(name=settings.driver)))
        collector = _Collector()
        args = [
            str(module),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            tmp,
            "-o",
            "asyncio_mode=auto",
            "-o",
            "timeout=180",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-W",
            "ignore::pytest.PytestAssertRewriteWarning",
        ]
        if keyword:
            args += ["-k", keyword]
        code = pytest.main(args, plugins=[collector, _SettingsPlugin(settings)])
    table = Table("scenario", "result", "seconds", "detail", title=f"driver {settings.driver}")
    colours = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for name, outcome, seconds, detail in collector.rows:
        table.add_row(
            name, f"[{colours.get(outcome, 'white')}]{outcome}[/]", f"{seconds:.2f}", detail
        )
    console.print(table)
    return int(code)
