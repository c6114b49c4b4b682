"""The Temporal driver logs stage attempts like the native one (the shared StageRunner logs
them) and records the user's traceback with a failed stage (issue 14)."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from engine_port import Registry, Retry, StageContext, Workflow

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal

HERE = str(Path(__file__).resolve())


class In(BaseModel):
    n: int = 0


async def test_stage_records_and_traceback_match_the_native_driver(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wfe")
    wf = Workflow("logs-t", input=In)
    tries: list[int] = []

    @wf.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=10)))
    async def flaky(ctx: StageContext[In]) -> int:
        tries.append(ctx.attempt)
        if len(tries) == 1:
            raise RuntimeError("first try fails")
        ctx.log.info("second try works")
        return 1

    @wf.stage(after=[flaky], retry=Retry(max_attempts=1))
    async def lookup(ctx: StageContext[In]) -> int:
        return {"a": 1}["missing_key"]

    engine = make_engine(Registry([wf]))
    async with engine, engine.worker():
        run = await engine.start("logs-t", {})
        info = await engine.wait(run.id, timeout=60)
        # the Web UI shows the run's failure with the stage and the user's traceback
        from temporalio.client import WorkflowFailureError

        with pytest.raises(WorkflowFailureError) as failed:
            await engine._conn.get_workflow_handle(run.id).result()
        cause = failed.value.cause
        assert getattr(cause, "type", None) == "KeyError"
        shown = cause.details[0]  # type: ignore[attr-defined]
        assert shown["stage"] == "lookup" and "in lookup" in shown["traceback"]

    assert info.status == "failed" and info.error is not None
    tb = info.error.traceback
    assert tb is not None and f'File "{HERE}", line' in tb and "in lookup" in tb
    assert tb.rstrip().endswith("KeyError: 'missing_key'") and "temporalio" not in tb

    mine = [r for r in caplog.records if getattr(r, "wfe_run_id", None) == run.id]
    stage = [
        (r.levelno, r.wfe_workflow, r.wfe_stage, r.wfe_attempt, r.getMessage().split(": ", 1)[1])  # type: ignore[attr-defined]
        for r in mine
        if r.name == "wfe.stage"
    ]
    assert stage[:4] == [
        (logging.INFO, "logs-t", "flaky", 1, "stage started"),
        (
            logging.WARNING,
            "logs-t",
            "flaky",
            1,
            "stage failed with RuntimeError: first try fails; retrying in 0.01s (attempt 2 of 3)",
        ),
        (logging.INFO, "logs-t", "flaky", 2, "stage started"),
        (logging.INFO, "logs-t", "flaky", 2, "stage completed"),
    ]
    assert stage[4][1:] == ("logs-t", "lookup", 1, "stage started")
    assert stage[5][0] == logging.ERROR and stage[5][2] == "lookup"
    assert "failed for good (no attempts left) with KeyError" in stage[5][4]
    user = [r for r in mine if r.name == "wfe.stage.user"]
    assert [(r.wfe_stage, r.wfe_attempt) for r in user] == [("flaky", 2)]  # type: ignore[attr-defined]
