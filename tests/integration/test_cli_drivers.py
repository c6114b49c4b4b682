"""The CLI builds any installed driver and names the installed ones when asked for another;
``wfe show --steps`` on the Temporal driver."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from engine_port import EngineSettings, Registry, RunStatus, StageContext, Workflow, create_engine
from tests.support.entry_points import write_dist_info
from wfe_cli import app


class Num(BaseModel):
    n: int = 0


@pytest.fixture(autouse=True)
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WFE_DATABASE_URL", f"sqlite:///{tmp_path / 'wfe.db'}")
    monkeypatch.setenv("WFE_BLOB_URL", f"file://{tmp_path / 'blobs'}")
    monkeypatch.chdir(tmp_path)


def test_an_unknown_driver_is_one_line_naming_the_installed_drivers() -> None:
    result = CliRunner().invoke(app, ["runs", "--driver", "oracle"], terminal_width=400)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    [line] = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert "unknown driver 'oracle'" in line
    assert "memory, native, temporal" in line


def test_the_cli_builds_a_driver_installed_by_another_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    write_dist_info(site, "acme-wfe", {"acme": "driver_memory:create_memory_engine"})
    monkeypatch.syspath_prepend(str(site))
    result = CliRunner().invoke(app, ["runs", "--driver", "acme", "--json"])
    assert result.exit_code == 0, result.output
    assert [json.loads(ln) for ln in result.stdout.splitlines() if ln.strip()] == []


@pytest.mark.temporal
def test_show_steps_on_temporal_lists_the_journaled_steps(
    temporal_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wfe show RUN --steps --driver temporal`` lists the steps the run journaled (the
    Temporal driver reads them from the BlobStore), as the native driver does."""
    monkeypatch.setenv("WFE_TEMPORAL_ADDRESS", temporal_server.address)
    monkeypatch.setenv("WFE_TASK_QUEUE", f"cli-{uuid.uuid4().hex[:8]}")
    wf = Workflow("cli-steps", input=Num)

    @wf.stage(signals=["approve"])
    async def pay(ctx: StageContext[Num]) -> Any:
        await ctx.step.run("charge", lambda: "charged")
        return await ctx.step.wait_for_signal("approve")

    async def run() -> str:
        settings = EngineSettings(driver="temporal")
        async with create_engine(settings, Registry([wf])) as engine, engine.worker():
            started = await engine.start(wf.id, {})
            await engine.signal(started.id, "approve", {"ok": True})  # taken by the wait
            assert (await engine.wait(started.id, timeout=60)).status == RunStatus.COMPLETED
            return started.id

    run_id = asyncio.run(run())
    result = CliRunner().invoke(app, ["show", run_id, "--steps", "--driver", "temporal", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == [
        {
            "stage": "pay",
            "name": "approve",
            "kind": "signal",
            "completed": True,
            "signal": "approve",
        },
        {"stage": "pay", "name": "charge", "kind": "run", "completed": True, "signal": None},
    ]
