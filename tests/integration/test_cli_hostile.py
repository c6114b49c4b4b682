"""The wfe command line used carelessly: what a user typed wrong, or a setup that is broken,
is one line on stderr saying what to do and an exit code, never a traceback or a half-done
action; a terminal of any width and a pipe show every value whole; Ctrl-C twice stops a
worker at once."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

import pytest
from pydantic import BaseModel
from rich.console import Console
from typer.testing import CliRunner

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from tests.integration.conftest import CliProcess
from tests.support.entry_points import write_dist_info
from wfe_cli import EXIT_CODES, app


class In(BaseModel):
    n: int = 0


def _registry() -> Registry:
    gate = Workflow("hostile-gate", input=In)

    @gate.stage(signals=["approval"])
    async def wait(ctx: StageContext[In]) -> object:
        return await ctx.step.wait_for_signal("approval")

    return Registry([gate])


def _start(n: int = 1) -> list[str]:
    async def go() -> list[str]:
        async with create_engine(EngineSettings(), _registry()) as engine:
            return [(await engine.start("hostile-gate", {"n": i})).id for i in range(n)]

    return asyncio.run(go())


def _one_line_error(result: Any) -> str:
    """stderr of a failed command: one ``error:`` line, no traceback, nothing on stdout."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "", result.stdout
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return str(lines[0])


# -- the app (--app) ----------------------------------------------------------------------


def test_an_app_that_fails_to_import_or_build_says_where_in_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    """An app module raising at import, with a syntax error or calling sys.exit, and a
    factory that raises, printed Python's traceback (exit 1) or exited silently with the
    module's own code; a file path given for a module gave a TypeError traceback."""
    (tmp_path / "raising_app.py").write_text("x = 1\nraise RuntimeError('no config here')\n")
    (tmp_path / "broken_app.py").write_text("registry = (\n")
    (tmp_path / "exiting_app.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "factory_app.py").write_text(
        "def build():\n    raise ValueError('the factory broke')\n"
    )
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    cases = {
        "raising_app": ["RuntimeError: no config here", "raising_app.py:2"],
        "broken_app": ["syntax error", "broken_app.py, line 1"],
        "exiting_app": ["sys.exit(3)"],
        "factory_app:build": ["ValueError: the factory broke"],
        "../elsewhere/app.py": ["names a file", "--app elsewhere.app"],
    }
    for given, expected in cases.items():
        for command in (["versions", "--app", given], ["worker", "--app", given]):
            result = runner.invoke(app, command)
            assert result.exit_code == EXIT_CODES["bad_config"], (command, result.output)
            line = _one_line_error(result)
            assert all(e in line for e in expected), (command, line)


# -- option values -----------------------------------------------------------------------


def test_huge_limits_and_durations_are_refused_or_mean_everything(env: dict[str, str]) -> None:
    """``--limit 99999999999999999999`` overflowed SQLite's integer and ``--since`` past the
    calendar overflowed a timedelta: both were tracebacks."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    [run_id] = _start()
    for command in (["runs", "--limit", "9" * 20], ["dlq", "list", "--limit", "9" * 20]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        assert "--limit" in result.output and "less than or equal to" in result.output
        assert "Traceback" not in result.output
    listed = runner.invoke(app, ["runs", "--since", "9" * 20 + "d", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [json.loads(ln)["id"] for ln in listed.stdout.splitlines()] == [run_id]
    endless = runner.invoke(app, ["runs", "--since", "9" * 400 + "d"])
    assert endless.exit_code == 2 and "too long a duration" in endless.output


def test_an_error_nobody_foresaw_is_one_line_not_a_traceback(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: a driver (here a broken third-party one) raising an error the
    CLI does not know is one line and exit 1; WFE_TRACEBACK=1 shows the traceback."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "broken_driver.py").write_text(
        "class Broken:\n"
        "    driver_name = 'broken'\n"
        "    async def __aenter__(self):\n"
        "        raise RuntimeError('the broken driver cannot connect')\n"
        "    async def __aexit__(self, *exc):\n"
        "        return None\n"
        "def create(settings, registry=None, **kw):\n"
        "    return Broken()\n"
    )
    write_dist_info(site, "broken-wfe", {"broken": "broken_driver:create"})
    monkeypatch.syspath_prepend(str(site))
    runner = CliRunner()
    result = runner.invoke(app, ["runs", "--driver", "broken", "--json"])
    assert result.exit_code == 1, result.output
    line = _one_line_error(result)
    assert "RuntimeError: the broken driver cannot connect" in line
    assert "WFE_TRACEBACK=1" in line
    monkeypatch.setenv("WFE_TRACEBACK", "1")
    shown = runner.invoke(app, ["runs", "--driver", "broken"])
    assert shown.exit_code == 1 and "Traceback" in shown.stderr


# -- commands that change runs ------------------------------------------------------------


def test_migrating_to_the_throwaway_memory_driver_is_refused_and_moves_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    """``wfe migrate --to memory`` marked every live run migrated, into a store that vanished
    when the command ended: the runs were lost. And ``--from native`` in the wrong folder
    created an empty database there."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    ids = _start(2)
    result = runner.invoke(app, ["migrate", "--from", "native", "--to", "memory"])
    assert result.exit_code == EXIT_CODES["bad_config"], result.output
    assert "would be marked migrated here and lost" in _one_line_error(result)
    listed = runner.invoke(app, ["runs", "--json"])
    assert {json.loads(ln)["status"] for ln in listed.stdout.splitlines()} == {"pending"}
    assert {json.loads(ln)["id"] for ln in listed.stdout.splitlines()} == set(ids)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)
    os.environ.pop("WFE_DATABASE_URL")  # (monkeypatch restores it)
    dry = runner.invoke(app, ["migrate", "--from", "native", "--to", "temporal", "--dry-run"])
    assert dry.exit_code == EXIT_CODES["unavailable"], dry.output
    assert "'wfe db upgrade'" in dry.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_drain_towards_a_misspelt_driver_is_refused(env: dict[str, str]) -> None:
    """``wfe drain W --target temporl`` drained W towards nothing: every new run refused."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    _start()
    result = runner.invoke(app, ["drain", "hostile-gate", "--target", "temporl"])
    assert result.exit_code == EXIT_CODES["bad_config"], result.output
    assert "--target 'temporl'" in result.stderr and "did you mean 'temporal'" in result.stderr
    same = runner.invoke(
        app, ["drain", "hostile-gate", "--target", "native"], env={"COLUMNS": "300"}
    )
    assert same.exit_code == 2 and "already start on native" in same.output
    versions = runner.invoke(app, ["versions", "--json"])
    assert [json.loads(ln)["new_runs_to"] for ln in versions.stdout.splitlines()] == [None]
    typo = runner.invoke(app, ["drain", "hostile-gat", "--target", "temporal"])
    assert typo.exit_code == 0
    assert "no run of 'hostile-gat' is known here" in typo.stderr


def test_a_signal_payload_comes_from_stdin_or_a_file(env: dict[str, str], tmp_path: Path) -> None:
    """A payload over the OS's 128 KiB argument limit could not be sent at all ('-' and '@FILE'
    were taken for JSON); a missing file is one line."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    first, second = _start(2)
    big = {"blob": "x" * 200_000}
    (tmp_path / "big.json").write_text(json.dumps(big))
    from_file = runner.invoke(app, ["signal", first, "approval", "@big.json", "--json"])
    assert from_file.exit_code == 0, from_file.output
    assert json.loads(from_file.stdout)["run_id"] == first
    piped = runner.invoke(app, ["signal", second, "approval", "-"], input='{"ok": true}')
    assert piped.exit_code == 0, piped.output
    missing = runner.invoke(app, ["signal", first, "approval", "@nope.json"])
    assert missing.exit_code == EXIT_CODES["bad_input"]
    assert "'nope.json' cannot be read: there is no such file" in _one_line_error(missing)
    empty = runner.invoke(app, ["signal", first, "approval", "-"], input="")
    assert empty.exit_code == EXIT_CODES["bad_input"] and "is empty" in empty.stderr

    async def signals() -> list[Any]:
        async with create_engine(EngineSettings(), _registry()) as engine:
            return [await engine.get_run(r) for r in (first, second)]

    assert [r.status for r in asyncio.run(signals())] == ["pending", "pending"]


# -- output ------------------------------------------------------------------------------


def test_a_narrow_terminal_shows_every_value_whole(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an 80-column terminal ``wfe runs`` cut every run id, version and date to ``2e02…``:
    a value that does not fit is now shown as a record, whole."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    [run_id] = _start()
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=80, markup=False, soft_wrap=True)
    monkeypatch.setattr("wfe_cli._output.console", terminal)
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == 0, result.output
    shown = screen.getvalue()
    assert run_id in shown and "…" not in shown
    assert all(len(line) <= 80 for line in screen.getvalue().splitlines())


def test_piped_output_is_never_cut_into_lines(env: dict[str, str]) -> None:
    """Piped, Rich wrapped a result line at 80 columns ("applied: [1, ..., 14, \\n15]")."""
    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert result.exit_code == 0
    [line] = result.stdout.splitlines()
    assert line.startswith("schema at version ") and line.endswith("])")


# -- processes: Ctrl-C, ports -------------------------------------------------------------


SLOW_APP = """
import asyncio
from pydantic import BaseModel
from engine_port import Registry, StageContext, Workflow

class In(BaseModel):
    n: int = 0

slow = Workflow("hostile-slow", input=In)

@slow.stage
async def nap(ctx: StageContext[In]) -> str:
    await asyncio.sleep(120)
    return "ok"

registry = Registry([slow])
"""


def _lines_until(stream: IO[str], text: str, deadline: float) -> str:
    seen = ""
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never came: {seen}")


def test_a_second_ctrl_c_stops_a_worker_at_once(tmp_path: Path, cli_process: CliProcess) -> None:
    """With a stage running, Ctrl-C waited for it (10 s of graceful shutdown) and a second
    Ctrl-C was ignored; now the first says so and the second stops the worker (130)."""
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    from wfe_cli._apps import load_registry

    async def start() -> None:
        async with create_engine(EngineSettings(), load_registry("slowapp")) as engine:
            await engine.start("hostile-slow", {})

    asyncio.run(start())
    proc = cli_process("worker", "--app", "slowapp")
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    _lines_until(proc.stdout, "stage started", deadline)
    proc.send_signal(signal.SIGINT)
    _lines_until(proc.stdout, "Ctrl-C again to stop now", deadline)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=5) == EXIT_CODES["interrupted"]
    rest = proc.stdout.read()
    assert "Traceback" not in rest and "stopping now" in rest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ui_on_a_port_in_use_is_one_line_and_exit_unavailable(env: dict[str, str]) -> None:
    """uvicorn logged "address already in use" after "wfe ui on http://..." and exited 3,
    which wfe documents as "not found"."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["ui", "--port", str(port)])
    assert result.exit_code == EXIT_CODES["unavailable"], result.output
    line = _one_line_error(result)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "in use" in line


def test_ui_on_the_ipv6_loopback_keeps_refusing_other_host_names(
    env: dict[str, str], cli_process: CliProcess
) -> None:
    """``--host [::1]`` (the usual spelling) was not taken for loopback: the page answered any
    Host header (no DNS-rebinding guard), and the URL printed was ``http://[[::1]]:PORT/``."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    assert CliRunner().invoke(app, ["db", "upgrade"]).exit_code == 0
    port = _free_port()
    proc = cli_process(
        "ui",
        "--host",
        "[::1]",
        "--port",
        str(port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert f"http://[::1]:{port}/" in line, line

    def status(host: str) -> int:
        request = urllib.request.Request(f"http://[::1]:{port}/runs", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    deadline = time.monotonic() + 30
    while True:
        try:
            first = status(f"[::1]:{port}")
            break
        except urllib.error.URLError:
            assert time.monotonic() < deadline and proc.poll() is None, "wfe ui never answered"
            time.sleep(0.05)
    assert first == 200
    assert status("evil.example") == 400


def test_conformance_exit_codes_keep_wfes_meaning(env: dict[str, str]) -> None:
    """pytest's own exit codes leaked out: a -k matching nothing exited 5 ("unavailable") and
    a malformed -k 4 ("wrong state")."""
    runner = CliRunner()
    none = runner.invoke(app, ["conformance", "-k", "no_such_scenario_anywhere"])
    assert none.exit_code == EXIT_CODES["bad_input"], none.output
    assert "no scenario matches -k" in none.stderr
    malformed = runner.invoke(app, ["conformance", "-k", "not("])
    assert malformed.exit_code == 2, malformed.output
    assert "the -k expression is malformed" in malformed.stderr


def test_dev_temporal_refuses_ports_out_of_range_before_starting_anything() -> None:
    """``--port 65000`` started the server with its Web UI on port 66000 and failed with
    "temporal server start-dev exited with code 1"; ``--port 0`` put the UI on port 1000."""
    runner = CliRunner()
    over = runner.invoke(app, ["dev", "temporal", "--port", "65000"])
    assert over.exit_code == 2 and "--ui-port" in over.output
    zero = runner.invoke(app, ["dev", "temporal", "--port", "0"])
    assert zero.exit_code == 2 and "--port" in zero.output
