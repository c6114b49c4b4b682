"""The wfe command line, end to end on the embedded default (a SQLite file in tmp_path)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.conftest import CliProcess
from wfe_cli import EXIT_CODES, app


def test_demo_runs_and_prints_the_run_its_stages_and_events(env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "completed" in out and "compensated" in out
    assert "order.charged" in out and "run.completed" in out and "run.failed" in out
    assert "the carrier rejected the parcel" in out


def test_db_upgrade_and_runs_listing(env: dict[str, str]) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["db", "upgrade"])
    assert first.exit_code == 0 and "schema at version" in first.output
    again = runner.invoke(app, ["db", "upgrade"])
    assert "applied: none" in again.output
    assert runner.invoke(app, ["demo"]).exit_code == 0
    listing = runner.invoke(app, ["runs", "--workflow", "demo-order"], terminal_width=200)
    assert listing.exit_code == 0, listing.output
    assert listing.output.count("demo-order") >= 2


def test_bad_input_is_a_clear_error_not_a_traceback(env: dict[str, str]) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    result = runner.invoke(app, ["signal", "no-such-run", "go", "{}"])
    assert result.exit_code == EXIT_CODES["not_found"]
    assert "no run with id 'no-such-run'" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["worker"])  # no --app and no WFE_APP
    assert result.exit_code != 0
    assert "no application given" in str(result.output) + str(result.exception)


def test_worker_process_shuts_down_gracefully_on_sigterm(cli_process: CliProcess) -> None:
    proc = cli_process("worker", "--app", "wfe_cli._demo:build_demo")
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    line = ""
    while "worker up" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
    assert "worker up" in line
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert "worker stopped" in proc.stdout.read()


def test_conformance_command_prints_a_table(env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["conformance", "-k", "s1_linear"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "test_s1_linear" in result.output and "passed" in result.output


@pytest.mark.temporal
def test_migrate_command_moves_runs_from_native_to_temporal(
    env: dict[str, str], temporal_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import uuid

    from engine_port import EngineSettings, Registry, create_engine
    from wfe_cli._demo import build_demo

    monkeypatch.setenv("WFE_TEMPORAL_ADDRESS", temporal_server.address)  # type: ignore[attr-defined]
    monkeypatch.setenv("WFE_TASK_QUEUE", f"cli-{uuid.uuid4().hex[:8]}")
    registry: Registry = build_demo()

    async def start_two() -> list[str]:
        async with create_engine(EngineSettings(), registry) as native:
            runs = [
                await native.start("demo-order", {"order_id": f"M-{i}", "total": 1.0})
                for i in range(2)
            ]
            return [r.id for r in runs]

    ids = asyncio.run(start_two())
    runner = CliRunner()
    dry = runner.invoke(
        app, ["migrate", "--from", "native", "--to", "temporal", "--dry-run"], terminal_width=200
    )
    assert dry.exit_code == 0, dry.output
    assert "would_move: 2" in dry.output
    moved = runner.invoke(
        app, ["migrate", "--from", "native", "--to", "temporal"], terminal_width=200
    )
    assert moved.exit_code == 0, moved.output
    assert "moved: 2" in moved.output
    again = runner.invoke(
        app, ["migrate", "--from", "native", "--to", "temporal"], terminal_width=200
    )
    assert again.exit_code == 0 and "moved: 0" in again.output  # rerun never duplicates

    async def check() -> None:
        async with create_engine(EngineSettings(), registry) as native:
            for rid in ids:
                info = await native.get_run(rid)
                assert info.status == "migrated" and info.migrated_to == "temporal"
        temporal = create_engine(EngineSettings(driver="temporal"), registry)
        async with temporal:
            for rid in ids:
                assert (await temporal.get_run(rid)).status in ("pending", "running", "suspended")

    asyncio.run(check())


def test_signal_with_an_idempotency_key_is_queued_once(env: dict[str, str]) -> None:
    import asyncio
    import json

    from pydantic import BaseModel

    from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine

    class In(BaseModel):
        pass

    wf = Workflow("cli-waiter", input=In)

    @wf.stage
    async def w(ctx: StageContext[In]) -> object:
        return await ctx.step.wait_for_signal("go")

    async def start() -> str:
        async with create_engine(EngineSettings(), Registry([wf])) as engine:
            return (await engine.start(wf.id, {})).id

    run_id = asyncio.run(start())
    runner = CliRunner()
    args = ["signal", run_id, "go", '{"n": 1}', "--idempotency-key", "k1"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["already_completed"] is False
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert json.loads(again.output) == {
        "run_id": run_id,
        "name": "go",
        "delivered": False,
        "already_completed": True,
    }


# -- issue 15: scriptable output, exit codes, config errors, every operation from the shell ----


def test_version_prints_the_installed_version(env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("wfe ") and result.stdout.strip() != "wfe"


APP_MODULE = """
from engine_port import Registry, StageContext, Workflow, NonRetryableError
from pydantic import BaseModel


class In(BaseModel):
    fail: bool = False


flaky = Workflow("cli-flaky", input=In)


@flaky.stage
async def first(ctx: StageContext[In]) -> str:
    return "one"


@flaky.stage(after=[first])
async def second(ctx: StageContext[In]) -> str:
    if ctx.input.fail:
        raise NonRetryableError("told to fail")
    return "two"
"""


async def _start_and_finish(workflow: str, payloads: list[dict[str, object]]) -> list[str]:
    """Start runs of the app in tmp_path and drive them to an end with an in-process worker."""
    from engine_port import create_engine, load_settings
    from wfe_cli._apps import load_registry

    registry = load_registry("cliapp")
    ids = []
    async with create_engine(load_settings(), registry) as engine, engine.worker():
        for p in payloads:
            ids.append((await engine.start(workflow, p)).id)
        for run_id in ids:
            await engine.wait(run_id, timeout=30)
    return ids


def test_runs_json_plain_rows_filters_and_redrive_from_the_shell(
    env: dict[str, str], tmp_path: Path
) -> None:
    import asyncio
    import json

    (tmp_path / "cliapp.py").write_text(APP_MODULE)
    ok, bad = asyncio.run(_start_and_finish("cli-flaky", [{}, {"fail": True}]))
    runner = CliRunner()

    # JSON lines, one per run; --status filters
    listing = runner.invoke(app, ["runs", "--json"])
    assert listing.exit_code == 0, listing.output
    rows = [json.loads(line) for line in listing.stdout.splitlines()]
    assert {r["id"] for r in rows} == {ok, bad}
    failed = runner.invoke(app, ["runs", "--json", "--status", "failed"])
    assert [json.loads(line)["id"] for line in failed.stdout.splitlines()] == [bad]
    wrong = runner.invoke(app, ["runs", "--status", "broken"])
    assert wrong.exit_code == 2 and "not a run status" in wrong.output

    # piped (not a terminal): a header and untruncated tab-separated rows
    plain = runner.invoke(app, ["runs", "--workflow", "cli-flaky"], terminal_width=40)
    lines = plain.stdout.splitlines()
    assert lines[0].split("\t")[:4] == ["run", "workflow", "version", "status"]
    assert {line.split("\t")[0] for line in lines[1:]} == {ok, bad}  # full ids

    # show --json is one document
    shown = json.loads(runner.invoke(app, ["show", bad, "--json"]).stdout)
    assert shown["status"] == "failed" and shown["error"]["message"] == "told to fail"

    # a redrive from the shell; a second redrive of an active run is a wrong-state error
    redriven = runner.invoke(app, ["redrive", bad, "--json", "--app", "cliapp"])
    assert redriven.exit_code == 0, redriven.output
    assert json.loads(redriven.stdout)["status"] in ("pending", "running")
    again = runner.invoke(app, ["redrive", bad])
    assert again.exit_code == EXIT_CODES["wrong_state"], again.output
    assert "error:" in again.stderr and again.stdout == ""

    # cancel a completed run: wrong state
    cancelled = runner.invoke(app, ["cancel", ok])
    assert cancelled.exit_code == EXIT_CODES["wrong_state"]


def test_purge_drain_and_dlq_from_the_shell(env: dict[str, str], tmp_path: Path) -> None:
    import asyncio
    import json

    (tmp_path / "cliapp.py").write_text(APP_MODULE)
    asyncio.run(_start_and_finish("cli-flaky", [{}]))
    runner = CliRunner()
    kept = runner.invoke(app, ["purge", "--older-than", "1h", "--json"])
    assert kept.exit_code == 0, kept.output
    assert json.loads(kept.stdout) == {"purged": 0}
    gone = runner.invoke(app, ["purge", "--older-than", "0s", "--json"])
    assert json.loads(gone.stdout) == {"purged": 1}
    assert runner.invoke(app, ["runs", "--json"]).stdout == ""
    bad = runner.invoke(app, ["purge", "--older-than", "soon"])
    assert bad.exit_code == 2 and "not a duration" in bad.output

    def new_runs_to() -> set[str | None]:
        listed = runner.invoke(app, ["versions", "--json"])
        assert listed.exit_code == 0, listed.output
        versions = [json.loads(line) for line in listed.stdout.splitlines()]
        return {v["new_runs_to"] for v in versions if v["workflow_id"] == "cli-flaky"}

    assert new_runs_to() == {None}
    drained = runner.invoke(app, ["drain", "cli-flaky", "--target", "temporal"])
    assert drained.exit_code == 0, drained.output
    assert new_runs_to() == {"temporal"}  # (`versions` showed only "drained": no active run)

    async def start() -> None:
        from engine_port import create_engine, load_settings
        from wfe_cli._apps import load_registry

        async with create_engine(load_settings(), load_registry("cliapp")) as engine:
            await engine.start("cli-flaky", {})

    from engine_port.errors import WorkflowDrainedError

    with pytest.raises(WorkflowDrainedError):
        asyncio.run(start())
    assert runner.invoke(app, ["drain", "cli-flaky", "--lift"]).exit_code == 0
    assert new_runs_to() == {None}
    asyncio.run(start())  # taken again

    replayed = runner.invoke(app, ["dlq", "replay", "--json"])
    assert replayed.exit_code == 0 and json.loads(replayed.stdout) == {"requeued": 0}


def test_app_is_imported_from_the_current_directory_as_module_or_workflow(
    env: dict[str, str], tmp_path: Path
) -> None:
    from engine_port.errors import ConfigurationError
    from wfe_cli._apps import load_registry

    (tmp_path / "cliapp2.py").write_text(APP_MODULE)
    assert sorted(load_registry("cliapp2").served()) == [("cli-flaky", _flaky_version())]
    assert [w for w, _ in load_registry("cliapp2:flaky").served()] == ["cli-flaky"]
    with pytest.raises(ConfigurationError, match="no attribute 'nope'"):
        load_registry("cliapp2:nope")
    with pytest.raises(ConfigurationError, match="cannot import 'missing_mod'"):
        load_registry("missing_mod:registry")
    result = CliRunner().invoke(app, ["worker", "--app", "cliapp2:In"])
    assert result.exit_code == EXIT_CODES["bad_config"]
    assert "is not a Registry, a Workflow" in result.stderr


def test_an_app_that_cannot_be_built_is_a_configuration_error_saying_why(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A factory that needs arguments was a TypeError traceback, an async one "not a
    Registry" with a never-awaited warning, and a module whose own import of a dependency
    failed was reported as not found ("run from the folder that holds it")."""
    from engine_port.errors import ConfigurationError
    from wfe_cli._apps import load_registry

    (tmp_path / "cliapp3.py").write_text(
        "from engine_port import Registry\n"
        "def needs(x): return Registry([])\n"
        "async def later(): return Registry([])\n"
    )
    (tmp_path / "cliapp4.py").write_text("import no_such_dependency_x\n")
    with pytest.raises(ConfigurationError, match="is a function that needs arguments"):
        load_registry("cliapp3:needs")
    with pytest.raises(ConfigurationError, match="is an async function"):
        load_registry("cliapp3:later")
    with pytest.raises(ConfigurationError, match="failed inside it: No module named 'no_such_"):
        load_registry("cliapp4")
    result = CliRunner().invoke(app, ["worker", "--app", "json:loads"])
    assert result.exit_code == EXIT_CODES["bad_config"], result.output
    assert "needs arguments" in result.stderr


def _flaky_version() -> str:
    """The version the app module's workflow gets (its graph fingerprint)."""
    import importlib

    return importlib.import_module("cliapp2").flaky.graph().version


def test_config_errors_are_one_line_naming_the_source(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    monkeypatch.setenv("WFE_DRIVER", "natve")
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == EXIT_CODES["bad_config"]
    message = result.stderr.strip()
    assert "\n" not in message  # one line, however long
    assert "environment variable WFE_DRIVER" in message
    assert "unknown driver 'natve'; did you mean 'native'? installed drivers: " in message
    assert "Traceback" not in result.output and "pydantic" not in message
    monkeypatch.delenv("WFE_DRIVER")

    (tmp_path / "wfe.toml").write_text('databse_url = "sqlite:///x.db"\n')
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == EXIT_CODES["bad_config"]
    assert "unknown setting 'databse_url' in wfe.toml; did you mean 'database_url'?" in (
        result.stderr
    )

    (tmp_path / "wfe.toml").write_text('[wfe]\ndriver = "native"\n')
    result = runner.invoke(app, ["runs"])
    assert "has a [wfe] table" in result.stderr

    (tmp_path / "wfe.toml").write_text("driver = \n")
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == EXIT_CODES["bad_config"] and "not valid TOML" in result.stderr


def test_read_commands_never_create_a_database_folder_or_table(
    env: dict[str, str], tmp_path: Path, pg_session: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy as sa

    runner = CliRunner()
    monkeypatch.setenv("WFE_DATABASE_URL", f"sqlite:///{tmp_path / 'state' / 'wfe.db'}")
    for args in (["runs"], ["show", "r1"], ["versions"], ["cancel", "r1"]):
        result = runner.invoke(app, args)
        assert result.exit_code == EXIT_CODES["unavailable"], (args, result.output)
        assert "'wfe db upgrade'" in result.stderr
    assert not (tmp_path / "state").exists()

    url = pg_session.new_schema()  # type: ignore[attr-defined]
    monkeypatch.setenv("WFE_DATABASE_URL", url)
    result = runner.invoke(app, ["runs"])
    assert result.exit_code == EXIT_CODES["unavailable"]
    assert "has no wfe tables" in result.stderr and "run 'wfe db upgrade' first" in result.stderr
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == []
    engine.dispose()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    assert runner.invoke(app, ["runs"]).exit_code == 0


def test_help_prints_the_extras_to_install_and_one_paragraph_per_command() -> None:
    """Rich markup took ``wfe[ui]`` for a style tag: ``wfe ui --help`` told users to
    ``pip install 'wfe'``, which installs no web view; and the command list kept the line
    breaks of the docstrings (``--retention 30d`` with its RST backticks)."""
    runner = CliRunner()
    ui = runner.invoke(app, ["ui", "--help"], terminal_width=200)
    assert ui.exit_code == 0, ui.output
    assert "pip install 'wfe[ui]'" in ui.output
    worker = runner.invoke(app, ["worker", "--help"], terminal_width=200)
    assert "wfe[metrics]" in worker.output
    listing = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "``" not in listing
    line = next(x for x in listing.splitlines() if " worker " in x)
    assert "SIGINT/SIGTERM (graceful shutdown). It logs each stage attempt" in line


def test_ids_that_look_like_markup_print_as_given(env: dict[str, str]) -> None:
    """What the CLI prints holds user data; Rich markup read ``a[b]`` as ``a`` plus a style
    tag, and ``wfe drain '[/x]'`` drained the workflow and then died with a MarkupError
    traceback instead of saying so."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0  # (drain creates no database)
    drained = runner.invoke(app, ["drain", "a[b]", "[/x]", "--target", "temporal"])
    assert drained.exit_code == 0, drained.output
    assert "a[b], [/x]" in drained.output
    lifted = runner.invoke(app, ["drain", "a[b]", "[/x]", "--lift"])
    assert lifted.exit_code == 0 and "a[b], [/x]" in lifted.output
    missing = runner.invoke(app, ["show", "[/x]"])
    assert missing.exit_code != 0 and "no run with id '[/x]'" in missing.output


def test_start_and_wait_from_the_shell(tmp_path: Path, cli_process: CliProcess) -> None:
    """`wfe start` (as `temporal workflow start`) and `wfe wait`, whose exit code tells a script
    how the run ended: 0 completed, 1 failed, 4 still active after --timeout."""
    import json

    (tmp_path / "cliapp.py").write_text(APP_MODULE)
    runner = CliRunner()
    ok = runner.invoke(app, ["start", "cli-flaky", "--app", "cliapp", "--json"])
    assert ok.exit_code == 0, ok.output
    ok_id = json.loads(ok.stdout)["id"]
    keyed = ["start", "cli-flaky", '{"fail": true}', "--app", "cliapp", "--idempotency-key", "k"]
    bad_id = runner.invoke(app, keyed).stdout.split(":")[0]
    assert runner.invoke(app, keyed).stdout.split(":")[0] == bad_id  # the same run again
    # refused before anything is written
    wrong = runner.invoke(app, ["start", "cli-flaky", '{"fail": [1]}', "--app", "cliapp"])
    assert wrong.exit_code == EXIT_CODES["bad_input"] and "fail" in wrong.stderr
    assert (
        runner.invoke(app, ["start", "nope", "--app", "cliapp"]).exit_code
        == (EXIT_CODES["not_found"])
    )
    assert runner.invoke(app, ["start", "cli-flaky"]).exit_code != 0  # no --app: says so
    # no worker yet: still pending after the timeout
    early = runner.invoke(app, ["wait", ok_id[:8], "--timeout", "0.2"])
    assert early.exit_code == EXIT_CODES["wrong_state"], early.output
    assert "still pending" in early.stderr and "worker" in early.stderr

    cli_process("worker", "--app", "cliapp")
    done = runner.invoke(app, ["wait", ok_id, "--timeout", "60"])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"{ok_id}: completed") and 'output "two"' in done.stdout
    failed = runner.invoke(app, ["wait", bad_id, "--timeout", "60"])
    assert failed.exit_code == 1 and "NonRetryableError: told to fail" in failed.stdout
    waited = runner.invoke(app, ["start", "cli-flaky", "--app", "cliapp", "--wait", "60"])
    assert waited.exit_code == 0 and ": completed" in waited.stdout, waited.output
