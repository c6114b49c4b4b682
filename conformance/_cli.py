"""``wfe conformance``: run the contract against the configured engine (for example a team's
own PostgreSQL or Temporal cluster) in a scratch area (:mod:`conformance._scratch`), with a
progress line per scenario, the failing scenarios' assertion messages and a summary line;
``--json`` prints one JSON document for CI."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.markup import escape

from ._containers import choose_servers, started_containers
from ._scratch import scratch_settings

__all__ = ["ScenarioResult", "run"]

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


@dataclass
class ScenarioResult:
    name: str
    outcome: str  # passed | failed | skipped
    seconds: float
    message: str  # the assertion message of a failure, the reason of a skip


class _SettingsPlugin:
    def __init__(self, settings: Any) -> None:
        self.settings = settings

    @pytest.fixture
    def wfe_configured_settings(self) -> Any:
        return self.settings


_COLOURS = {"passed": "green", "failed": "red", "skipped": "yellow"}


class _Progress:
    """Collects one result per scenario and reports it as it finishes."""

    def __init__(self, progress: Console | None) -> None:
        self.progress = progress
        self.results: list[ScenarioResult] = []
        self.total = 0
        self.collect_errors: list[str] = []

    def pytest_collection_finish(self, session: Any) -> None:
        self.total = len(session.items)  # after -k deselection

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collect_errors.append(_message(report))

    def pytest_runtest_logreport(self, report: Any) -> None:
        failed_setup = report.when in ("setup", "teardown") and report.outcome != "passed"
        if report.when != "call" and not failed_setup:
            return
        name = report.nodeid.split("::")[-1]
        if self.results and self.results[-1].name == name:
            if report.outcome == "failed" and self.results[-1].outcome != "failed":
                self.results[-1] = ScenarioResult(name, "failed", report.duration, _message(report))
            return
        result = ScenarioResult(name, report.outcome, report.duration, "")
        if report.outcome != "passed":
            result.message = _message(report)
        self.results.append(result)
        if self.progress is not None:
            colour = _COLOURS.get(report.outcome, "white")
            self.progress.print(
                f"[{len(self.results)}/{self.total}] {escape(name)} "
                f"[{colour}]{report.outcome}[/] {report.duration:.2f}s",
                highlight=False,
                markup=True,  # (the names and messages are escaped)
            )


def _message(report: Any) -> str:
    """The assertion message of a failure (not its traceback), the reason of a skip."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message)
    text = str(longrepr).strip().splitlines()
    return text[-1] if text else ""


def _summary(results: list[ScenarioResult], seconds: float) -> dict[str, Any]:
    counts = {o: sum(r.outcome == o for r in results) for o in ("passed", "failed", "skipped")}
    return {"scenarios": len(results), **counts, "seconds": round(seconds, 2)}


def run(
    settings: Any,
    keyword: str | None,
    console: Console,
    *,
    as_json: bool = False,
    progress: Console | None = None,
    containers: bool = False,
    search_attributes: Sequence[str] = (),
) -> int:
    """Run the suite in a scratch area (on throwaway containers with ``containers``);
    returns the exit code (0 when every scenario that ran passed)."""
    started = time.monotonic()
    collector = _Progress(None if as_json else progress or console)
    with contextlib.ExitStack() as stack:
        if choose_servers(containers) == "containers":
            servers = stack.enter_context(started_containers(search_attributes=search_attributes))
            settings = settings.model_copy(update=servers.settings_update(settings.driver))
        code = _run_suite(settings, keyword, collector, own_blobs=not containers)
    return _report(settings, collector, code, time.monotonic() - started, console, as_json)


def _run_suite(settings: Any, keyword: str | None, collector: _Progress, own_blobs: bool) -> int:
    with (
        scratch_settings(settings, own_blobs=own_blobs) as scratch,
        tempfile.TemporaryDirectory(prefix="wfe-conformance-tests-") as tmp,
    ):
        # a fresh module name per run: a second run in one process must not meet the first
        module = Path(tmp) / f"test_wfe_conformance_{uuid.uuid4().hex[:12]}.py"
        module.write_text(textwrap.dedent(_TEST_MODULE.format(name=settings.driver)))
        args = [
            str(module),
            "-p",
            "no:terminal",
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
        return int(pytest.main(args, plugins=[collector, _SettingsPlugin(scratch)]))


def _report(
    settings: Any,
    collector: _Progress,
    code: int,
    seconds: float,
    console: Console,
    as_json: bool,
) -> int:
    results = collector.results
    summary = _summary(results, seconds)
    if collector.collect_errors and code == 0:
        code = 1
    if as_json:
        doc = {
            "driver": settings.driver,
            "summary": summary,
            "scenarios": [asdict(r) for r in results],
            "errors": collector.collect_errors,
        }
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()
        return code
    for error in collector.collect_errors:
        console.print(f"[red]collection error:[/red] {escape(error)}", highlight=False, markup=True)
    for r in results:
        if r.outcome == "failed":
            console.print(f"[red]FAILED[/red] {escape(r.name)}: {escape(r.message)}", markup=True)
    line = (
        f"driver {settings.driver}: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['skipped']} skipped of {summary['scenarios']} scenarios "
        f"in {summary['seconds']:.1f}s"
    )
    if not results and code == pytest.ExitCode.NO_TESTS_COLLECTED:
        line += " (no scenario matches -k)"
    console.print(line, highlight=False)
    return code
