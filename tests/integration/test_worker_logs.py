"""What a native worker logs about runs (issue 14: logs), and the traceback a failed stage
records: on the embedded SQLite default, and from a ``wfe worker`` process."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    Retry,
    StageContext,
    Workflow,
    create_engine,
)

HERE = Path(__file__).resolve()


class In(BaseModel):
    n: int = 0


def build() -> Registry:
    flow = Workflow("logs-flow", input=In)
    tries: dict[str, int] = {}

    @flow.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=10)))
    async def flaky(ctx: StageContext[In]) -> int:
        tries[ctx.run_id] = tries.get(ctx.run_id, 0) + 1
        if tries[ctx.run_id] == 1:
            raise RuntimeError("first try fails")
        return 1

    @flow.stage(after=[flaky])
    async def approve(ctx: StageContext[In]) -> str:
        ctx.log.info("asking for approval of %d", ctx.input.n)
        answer = await ctx.step.wait_for_signal("approval")
        return str(answer)

    saga = Workflow("logs-saga", input=In)

    @saga.stage
    async def reserve(ctx: StageContext[In]) -> int:
        ctx.log.info("reserving")
        return 7

    @reserve.compensation
    async def release(ctx: StageContext[In], output: int) -> None:
        ctx.log.warning("releasing %d", output)

    @saga.stage(after=[reserve], retry=Retry(max_attempts=1))
    async def lookup(ctx: StageContext[In]) -> int:
        return {"a": 1}["missing_key"]  # the user's bug: line named in the traceback

    hang = Workflow("logs-hang", input=In)

    @hang.stage
    async def forever(ctx: StageContext[In]) -> None:
        ctx.log.info("hanging")
        await asyncio.Event().wait()

    return Registry([flow, saga, hang])


def _records(caplog: pytest.LogCaptureFixture, run_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "wfe_run_id", None) == run_id]


def _fields(r: logging.LogRecord) -> tuple[str, str, int]:
    return (r.wfe_workflow, r.wfe_stage, r.wfe_attempt)  # type: ignore[attr-defined]


async def test_worker_logs_each_attempt_retry_suspension_resume_and_compensation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wfe")
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    async with create_engine(settings, build()) as engine, engine.worker():
        run = await engine.start("logs-flow", {"n": 5})
        deadline = time.monotonic() + 30
        while (await engine.get_run(run.id)).status != "suspended":
            assert time.monotonic() < deadline
            await _tick()
        await engine.signal(run.id, "approval", "yes")
        assert (await engine.wait(run.id, timeout=30)).status == "completed"
        saga = await engine.start("logs-saga", {})
        info = await engine.wait(saga.id, timeout=30)
    assert info.status == "failed"

    flow = [(r.levelno, r.name, _fields(r), r.getMessage()) for r in _records(caplog, run.id)]
    stage_msgs = [(lvl, f, m.split(": ", 1)[1]) for lvl, name, f, m in flow if name == "wfe.stage"]
    wf = "logs-flow"
    assert stage_msgs[:4] == [
        (logging.INFO, (wf, "flaky", 1), "stage started"),
        (
            logging.WARNING,
            (wf, "flaky", 1),
            "stage failed with RuntimeError: first try fails; retrying in 0.01s (attempt 2 of 3)",
        ),
        (logging.INFO, (wf, "flaky", 2), "stage started"),
        (logging.INFO, (wf, "flaky", 2), "stage completed"),
    ]
    assert stage_msgs[4:7] == [
        (logging.INFO, (wf, "approve", 1), "stage started"),
        (logging.INFO, (wf, "approve", 1), "stage suspended, waiting for signal:approval"),
        (logging.INFO, (wf, "approve", 1), "stage resumed"),
    ]
    assert stage_msgs[-1] == (logging.INFO, (wf, "approve", 1), "stage completed")
    # every message names the run in its text too
    assert all(m.startswith(f"run {run.id} {wf}/") for _, _, _, m in flow)
    user = [(f, m) for _, name, f, m in flow if name == "wfe.stage.user"]
    assert user[0] == (
        (wf, "approve", 1),
        f"run {run.id} {wf}/approve attempt 1: asking for approval of 5",
    )

    saga_recs = _records(caplog, saga.id)
    failed = [r for r in saga_recs if r.levelno == logging.ERROR]
    assert len(failed) == 1 and failed[0].wfe_stage == "lookup"  # type: ignore[attr-defined]
    msg = failed[0].getMessage()
    assert "failed for good (no attempts left) with KeyError: 'missing_key'" in msg
    assert 'return {"a": 1}["missing_key"]' in msg  # the traceback, with the user's line
    comp = [r.getMessage().split(": ", 1)[1] for r in saga_recs if r.name == "wfe.stage"]
    assert comp[-2:] == ["compensation started", "compensation completed"]
    warned = [r for r in saga_recs if r.name == "wfe.stage.user"]
    assert [(_fields(r), r.levelno) for r in warned] == [
        (("logs-saga", "reserve", 1), logging.INFO),
        (("logs-saga", "reserve", 1), logging.WARNING),
    ]


async def _tick() -> None:
    await asyncio.sleep(0.02)


async def test_a_failed_stage_records_the_traceback_of_the_users_raise(tmp_path: Path) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    sink = MemorySink()
    async with create_engine(settings, build(), event_sink=sink) as engine, engine.worker():
        run = await engine.start("logs-saga", {})
        info = await engine.wait(run.id, timeout=30)
        await engine.flush_events()
    events = sink.for_run(run.id)
    assert info.status == "failed" and info.error is not None
    assert (info.error.type, info.error.message) == ("KeyError", "'missing_key'")
    tb = info.error.traceback
    assert tb is not None
    assert tb.startswith("Traceback (most recent call last):\n")
    assert f'File "{HERE}", line' in tb and "in lookup" in tb
    assert tb.rstrip().endswith("KeyError: 'missing_key'")
    assert "engine_port" not in tb and "asyncio" not in tb  # no engine frames above the user's
    lookup = next(s for s in info.stages if s.id == "lookup")
    assert lookup.error is not None and lookup.error.traceback == tb
    failed = [e for e in events if e.type == "stage.failed"]
    # events keep their shape: the traceback is in the run's record, not in every event
    assert failed and failed[0].data["error"] == {"type": "KeyError", "message": "'missing_key'"}


async def test_cancelling_a_running_stage_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wfe")
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    async with create_engine(settings, build()) as engine, engine.worker():
        run = await engine.start("logs-hang", {})
        deadline = time.monotonic() + 30
        while not [r for r in _records(caplog, run.id) if r.name == "wfe.stage.user"]:
            assert time.monotonic() < deadline
            await _tick()
        await engine.cancel(run.id)
        assert (await engine.wait(run.id, timeout=30)).status == "cancelled"
    cancelled = [
        (r.name, _fields(r))
        for r in _records(caplog, run.id)
        if r.getMessage().split(": ", 1)[1].startswith("stage cancelled")
    ]
    assert cancelled == [
        ("wfe.stage", ("logs-hang", "forever", 1)),
        ("wfe.worker", ("logs-hang", "forever", 1)),
    ]


def json_worker(
    tmp_path: Path, app: str, log_format: str = "json"
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """``wfe worker --app APP --log-format json`` on a new SQLite database in ``tmp_path``
    (stderr piped, no PYTHONWARNINGS from outside), and the environment it runs with."""
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "PYTHONPATH": str(HERE.parents[2]),
    }
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "wfe_cli", "worker", "--app", app, "--log-format", log_format],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    return proc, env


def test_wfe_worker_log_format_json_prints_one_object_per_line(tmp_path: Path) -> None:
    proc, env = json_worker(tmp_path, "tests.integration.test_worker_logs:build")
    try:

        async def start() -> str:
            settings = EngineSettings(
                database_url=env["WFE_DATABASE_URL"], blob_url=env["WFE_BLOB_URL"]
            )
            async with create_engine(settings, build()) as engine:
                return (await engine.start("logs-saga", {})).id

        run_id = asyncio.run(start())
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "the worker exited"
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            seen.append(doc)
            if doc.get("wfe_run_id") == run_id and doc["message"].endswith(
                "compensation completed"
            ):
                break
        mine = [d for d in seen if d.get("wfe_run_id") == run_id]
        assert {"time", "level", "logger", "message", "wfe_stage", "wfe_attempt"} <= set(mine[0])
        assert [d["wfe_stage"] for d in mine if d["message"].endswith("stage started")] == [
            "reserve",
            "lookup",
        ]
        assert any(d["level"] == "ERROR" and d["wfe_stage"] == "lookup" for d in mine)
        user = [d for d in mine if d["logger"] == "wfe.stage.user"]  # ctx.log, INFO by default
        assert user[0]["level"] == "INFO" and user[0]["message"].endswith("reserving")
        # stopping is logged as JSON too (it was a plain "stopping (...)" line)
        proc.terminate()
        rest = proc.communicate(timeout=60)[1].splitlines()
        stopping = [json.loads(line) for line in rest if line.strip()]
        assert any(d["message"].startswith("stopping (") for d in stopping), rest
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def test_a_bad_log_level_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from wfe_cli import EXIT_CODES, app

    monkeypatch.setenv("WFE_LOG_LEVEL", "LOUD")
    result = CliRunner().invoke(app, ["worker", "--app", "tests.integration.test_worker_logs"])
    assert result.exit_code == EXIT_CODES["bad_config"]
    assert "unknown log level 'LOUD'" in result.stderr and "WFE_LOG_LEVEL" in result.stderr
    monkeypatch.delenv("WFE_LOG_LEVEL")
    result = CliRunner().invoke(app, ["worker", "--log-format", "xml"])
    assert result.exit_code == EXIT_CODES["bad_config"]
    assert "use --log-format text or json" in result.stderr
