"""``wfe conformance`` runs in a scratch area: the user's database, event sink and blobs are
never touched, the area is removed, and the output is a line per scenario, the failures'
assertion messages and a summary line (or one JSON document)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from tests.support.databases import PostgresSession
from wfe_cli import app

SCENARIOS = "test_s1_linear or test_s7_signal_after_wait"


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's configuration: their own database, blobs and event sink."""
    monkeypatch.setenv("WFE_DATABASE_URL", f"sqlite:///{tmp_path / 'user.db'}")
    monkeypatch.setenv("WFE_BLOB_URL", f"file://{tmp_path / 'user-blobs'}")
    monkeypatch.setenv("WFE_EVENT_SINK", f"jsonl://{tmp_path / 'user-events.jsonl'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_conformance_leaves_the_users_database_sink_and_blobs_alone(user: Path) -> None:
    # (with the purge scenario after another: it purged that one's finished runs too, and
    # failed counting them)
    result = CliRunner().invoke(app, ["conformance", "-k", f"{SCENARIOS} or test_s11"])
    assert result.exit_code == 0, result.output
    lines = sorted(line.split("] ")[1] for line in result.stderr.splitlines())
    assert [line.rsplit(" ", 1)[0] for line in lines] == [
        "test_s11_a_purged_run_is_gone_and_its_key_starts_a_new_run passed",
        "test_s11_idempotent_start passed",
        "test_s1_linear passed",
        "test_s7_signal_after_wait passed",
    ]
    assert "[4/4] " in result.stderr
    assert "driver native: 4 passed, 0 failed, 0 skipped of 4 scenarios" in result.stdout
    assert sorted(p.name for p in user.iterdir()) == []  # no database, blobs or events


def test_conformance_json_and_the_failing_scenarios_assertion_message(
    user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import conformance._flow

    def broken(name: str, data: object) -> None:
        raise AssertionError(f"the {name} trace differs from the golden one")

    monkeypatch.setattr(conformance._flow, "check_golden", broken)
    result = CliRunner().invoke(app, ["conformance", "-k", SCENARIOS, "--json"])
    assert result.exit_code == 1
    assert result.stderr == ""  # no progress lines in --json
    doc = json.loads(result.stdout)
    assert doc["summary"] | {"seconds": 0} == {
        "scenarios": 2,
        "passed": 1,
        "failed": 1,
        "skipped": 0,
        "seconds": 0,
    }
    failed = [s for s in doc["scenarios"] if s["outcome"] == "failed"]
    assert [s["name"] for s in failed] == ["test_s1_linear"]
    assert failed[0]["message"] == "AssertionError: the s1_linear trace differs from the golden one"

    human = CliRunner().invoke(app, ["conformance", "-k", "test_s1_linear"])
    assert human.exit_code == 1
    assert "FAILED test_s1_linear: AssertionError: the s1_linear trace differs" in human.stdout
    assert "0 passed, 1 failed" in human.stdout
    assert "Traceback" not in human.output


@pytest.mark.postgres
def test_conformance_on_postgresql_uses_a_schema_of_its_own_and_drops_it(
    user: Path, pg_session: PostgresSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_session.new_schema()  # the user's database (a schema on the test server)
    monkeypatch.setenv("WFE_DATABASE_URL", url)
    schema = url.rsplit("search_path%3D", 1)[1]
    result = CliRunner().invoke(app, ["conformance", "-k", "test_s1_linear"])
    assert result.exit_code == 0, result.output
    with pg_session.engine.connect() as conn:
        schemas = set(conn.execute(sa.text("SELECT nspname FROM pg_namespace")).scalars())
        tables = conn.execute(
            sa.text("SELECT count(*) FROM pg_tables WHERE schemaname = :s"), {"s": schema}
        ).scalar_one()
    assert not [s for s in schemas if s.startswith("wfe_conformance_")]
    assert tables == 0  # nothing was created in the user's schema


@pytest.mark.temporal
def test_conformance_on_temporal_uses_task_queues_of_its_own_and_deletes_its_runs(
    user: Path, temporal_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from temporalio.client import Client

    address = temporal_server.address  # type: ignore[attr-defined]
    monkeypatch.setenv("WFE_DRIVER", "temporal")
    monkeypatch.setenv("WFE_TEMPORAL_ADDRESS", address)
    monkeypatch.setenv("WFE_TASK_QUEUE", "users-queue")
    result = CliRunner().invoke(app, ["conformance", "-k", "test_s1_linear"])
    assert result.exit_code == 0, result.output
    assert "driver temporal: 1 passed" in result.stdout

    async def left() -> list[str]:
        client = await Client.connect(address)
        return [
            ex.id async for ex in client.list_workflows("TaskQueue STARTS_WITH 'conformance-'")
        ] + [ex.id async for ex in client.list_workflows("TaskQueue STARTS_WITH 'users-queue'")]

    assert asyncio.run(left()) == []  # the command waits until they are gone
    assert sorted(p.name for p in user.iterdir()) == []


# -- a failing scenario's bare assert says what differed (pytest's rewritten message) --------

BROKEN_DRIVER = '''
"""lying_wfe: the native driver, except that a finished run always reads as failed."""
from engine_port import RunStatus, create_engine


def create(settings, registry, **ports):
    engine = create_engine(settings.model_copy(update={"driver": "native"}), registry, **ports)
    real_wait = engine.wait

    async def wait(run_id, *args, **kwargs):
        info = await real_wait(run_id, *args, **kwargs)
        return info.model_copy(update={"status": RunStatus.FAILED})

    engine.wait = wait
    return engine
'''


def test_a_bare_assert_in_a_failing_scenario_says_what_differed(tmp_path: Path) -> None:
    """``wfe conformance`` imported the scenarios before pytest could rewrite their asserts:
    a failing ``assert info.status == RunStatus.COMPLETED`` (no message of its own) was
    reported as a bare ``AssertionError``."""
    import os
    import subprocess
    import sys

    from tests.support.entry_points import write_dist_info

    src, site = tmp_path / "src", tmp_path / "site"
    (src / "lying_wfe").mkdir(parents=True)
    (src / "lying_wfe" / "__init__.py").write_text(BROKEN_DRIVER)
    write_dist_info(site, "lying-wfe", {"lying": "lying_wfe:create"})
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WFE_", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(site), str(root)])
    env["WFE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'user.db'}"
    env["WFE_BLOB_URL"] = f"file://{tmp_path / 'user-blobs'}"
    for as_json in (False, True):
        done = subprocess.run(
            [
                *[sys.executable, "-m", "wfe_cli", "conformance", "--driver", "lying"],
                *["-k", "test_s1_linear", *(["--json"] if as_json else [])],
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        if as_json:
            [failed] = json.loads(done.stdout)["scenarios"]
            message = failed["message"]
        else:
            message = done.stdout.split("FAILED test_s1_linear: ", 1)[1]
        # (pytest shortens the right side: <RunStatus.CO...: 'completed'>)
        assert message.startswith("AssertionError: assert <RunStatus.FAILED: 'failed'> == <Run")
        assert "'completed'>" in message.splitlines()[0], message
