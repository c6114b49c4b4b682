"""The wfe command line, end to end on the embedded default (a SQLite file in tmp_path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine_port._cli import app


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    return values


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
    result = runner.invoke(app, ["signal", "no-such-run", "go", "{}"])
    assert result.exit_code == 2
    assert "no run with id 'no-such-run'" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["worker"])  # no --app and no WFE_APP
    assert result.exit_code != 0
    assert "no application given" in str(result.output) + str(result.exception)


def test_worker_process_shuts_down_gracefully_on_sigterm(env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_port", "worker", "--app", "engine_port._demo:build_demo"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while "worker up" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        assert "worker up" in line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "worker stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
    from engine_port._demo import build_demo

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
