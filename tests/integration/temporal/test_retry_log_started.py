"""A retry is a new attempt: its log line says "stage started", not "stage resumed" (as on
the native driver, ``tests/integration/native/test_ops_probe_retry_log.py``).

``StageRequest.resumed`` means "journaled steps from an earlier execution of *this*
attempt" (a suspension, a lost worker); the stage activity set it whenever the task carried
journaled steps, so attempt 2 of a stage whose attempt 1 journaled a step and then failed
logged "attempt 2: stage resumed". The workflow now tells the activity whether the attempt
is a new one (``new_attempt``). A resumption after a signal wait still says "resumed"."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import Registry, Retry, StageContext, Workflow

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


@pytest.mark.parametrize("local", [False, True], ids=["activity", "local"])
async def test_a_retry_with_journaled_steps_is_logged_as_started(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture, local: bool
) -> None:
    caplog.set_level(logging.INFO, logger="wfe.stage")
    wf: Workflow[In] = Workflow(f"retry-log-t-{local}", input=In)

    @wf.stage(signals=["go"], local=local)
    async def wait(ctx: StageContext[In]) -> Any:
        await ctx.step.run("before", lambda: "x")
        return await ctx.step.wait_for_signal("go")

    @wf.stage(
        after=[wait],
        local=local,
        retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=10)),
    )
    async def flaky(ctx: StageContext[In]) -> Any:
        await ctx.step.run("charge", lambda: "txn")
        if ctx.attempt == 1:
            raise RuntimeError("first attempt breaks")
        return "ok"

    engine = make_engine(Registry([wf]))
    async with engine, engine.worker():
        run = await engine.start(wf.id, {})
        deadline = time.monotonic() + 60
        while (await engine.get_run(run.id)).status != "suspended":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await engine.signal(run.id, "go", None)
        info = await engine.wait(run.id, timeout=60)
    assert info.status == "completed"

    said = [
        (r.wfe_stage, r.wfe_attempt, r.getMessage().split(": ", 1)[1])  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "wfe.stage" and r.getMessage().endswith(("started", "resumed"))
    ]
    assert ("wait", 1, "stage started") in said, said
    assert ("wait", 1, "stage resumed") in said, said
    assert ("flaky", 1, "stage started") in said, said
    assert ("flaky", 2, "stage started") in said, said
    assert ("flaky", 2, "stage resumed") not in said, said
