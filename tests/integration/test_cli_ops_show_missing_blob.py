"""``wfe show`` of a run whose spilled value is gone from the blob store (an S3 server
restarted without its data, a blob deleted by hand): the operator still sees the run (its
status, stages and error, the missing value as null) on stdout, and the missing key with
what to do on stderr, exit 1. It printed only the error, so the run that failed with
SpilledPayloadUnavailableError could not be inspected before its blobs were restored."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from wfe_cli import app


class In(BaseModel):
    n: int = 0


def _registry() -> Registry:
    wf = Workflow("ops-show", input=In)

    @wf.stage(signals=["go"])
    async def first(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    @wf.stage(after=[first], signals=["again"])
    async def second(ctx: StageContext[In]) -> Any:
        await ctx.step.wait_for_signal("again")
        return {"seen": len(str(ctx.output_of(first)))}

    return Registry([wf])


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WFE_DATABASE_URL", f"sqlite:///{tmp_path / 'wfe.db'}")
    monkeypatch.setenv("WFE_BLOB_URL", f"file://{tmp_path / 'blobs'}")
    monkeypatch.setenv("WFE_SPILL_THRESHOLD_BYTES", "1000")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _failed_on_a_missing_blob(tmp: Path) -> str:
    """A run whose first stage's spilled output vanished while the second stage waited."""

    async def until(engine: Any, run_id: str, stage: int, status: str) -> None:
        for _ in range(1000):
            runs = await engine.list_runs(id_prefix=run_id, outputs=False)
            if runs[0].stages[stage].status == status:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"stage {stage} of {run_id} never became {status}")

    async def go() -> str:
        async with create_engine(EngineSettings(), _registry()) as engine:
            run = await engine.start("ops-show", {"n": 1})
            async with engine.worker():
                await until(engine, run.id, 0, "suspended")
                await engine.signal(run.id, "go", {"doc": "y" * 5000})  # spilled
                await until(engine, run.id, 1, "suspended")
                shutil.rmtree(tmp / "blobs" / "runs" / run.id)
                await engine.signal(run.id, "again", None)
                await until(engine, run.id, 1, "failed")
            return run.id

    return asyncio.run(go())


def test_show_prints_the_run_and_names_the_missing_value(env: Path) -> None:
    run_id = _failed_on_a_missing_blob(env)
    runner = CliRunner()
    for extra in ([], ["--events", "--steps"]):
        shown = runner.invoke(app, ["show", run_id[:8], "--json", *extra])
        assert shown.exit_code == 1, shown.output
        assert "not in the blob store" in shown.stderr
        assert "Traceback" not in shown.output
        doc = json.loads(shown.stdout)
        run = doc["run"] if extra else doc
        assert run["id"] == run_id and run["status"] == "failed"
        assert run["error"]["type"] == "SpilledPayloadUnavailableError"
        assert [s["status"] for s in run["stages"]] == ["completed", "failed"]
        assert run["stages"][0]["output"] is None  # the value that is gone
        if extra:
            assert doc["attempts"] and doc["events"]
