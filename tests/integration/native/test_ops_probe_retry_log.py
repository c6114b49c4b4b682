"""A retry is a new attempt: its log line says "stage started", not "stage resumed".

``StageRequest.resumed`` means "journaled steps from an earlier execution of *this*
attempt" (a suspension, a crash); the kernel set it whenever the stage had journaled steps,
so attempt 2 of a stage whose attempt 1 journaled a step and then failed logged "attempt 2:
stage resumed" right after "retrying in 0.5s (attempt 2 of 3)". A resumption after a
signal wait still says "resumed"."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import Retry, StageContext, Workflow

from .conftest import MakeEngine


class In(BaseModel):
    n: int = 0


async def test_a_retry_with_journaled_steps_is_logged_as_started(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wfe.stage")
    wf: Workflow[In] = Workflow("ops-retry-log", input=In)

    @wf.stage(signals=["go"])
    async def wait(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    @wf.stage(after=[wait], retry=Retry(max_attempts=2, initial_interval=timedelta(0)))
    async def flaky(ctx: StageContext[In]) -> Any:
        await ctx.step.run("charge", lambda: "txn")
        if ctx.attempt == 1:
            raise RuntimeError("first attempt breaks")
        return "ok"

    engine = await make_engine(wf)
    run = await engine.start(wf.id, {})
    async with engine.worker(poll_interval=0.01):
        deadline = time.monotonic() + 30
        while (await engine.get_run(run.id)).status != "suspended":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await engine.signal(run.id, "go", None)
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed"

    said = [
        (r.wfe_stage, r.wfe_attempt, r.getMessage().split(": ", 1)[1])  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "wfe.stage" and r.getMessage().endswith(("started", "resumed"))
    ]
    assert ("wait", 1, "stage resumed") in said, said
    assert ("flaky", 1, "stage started") in said, said
    assert ("flaky", 2, "stage started") in said, said
    assert ("flaky", 2, "stage resumed") not in said, said
