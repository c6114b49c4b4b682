"""User code a stage calls (step functions, hook handlers, wait_for checks, compensations)
raising what ``except Exception`` misses: the attempt fails with a readable error, and
nothing ends the event loop the engine runs on (DESIGN §5)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    Completed,
    Failed,
    InMemoryLedger,
    Registry,
    StageContext,
    StageRequest,
    StageRunner,
    Workflow,
)


class In(BaseModel):
    pass


def _exit(*args: Any) -> None:
    raise SystemExit(3)


async def _async_exit(*args: Any) -> None:
    raise SystemExit(3)


def _sync_stage(call: Callable[[StageContext[In]], Any]) -> Workflow[In]:
    wf = Workflow("wf", input=In, hooks=["h"])

    @wf.stage
    def a(ctx: StageContext[In]) -> int:
        call(ctx)
        return 1

    return wf


# each a sync stage body calling user code that raises SystemExit through the blocking forms
# (ctx.sync_step / ctx.hook_sync), which run it as a task of the engine's event loop
CALLS: dict[str, Callable[[StageContext[In]], Any]] = {
    "sync_step.run of a sync fn": lambda ctx: ctx.sync_step.run("s", _exit),
    "sync_step.run of an async fn": lambda ctx: ctx.sync_step.run("s", _async_exit),
    "sync_step.wait_for": lambda ctx: ctx.sync_step.wait_for("w", _exit, interval=1),
    "hook_sync": lambda ctx: ctx.hook_sync("h", {}),
}


def _attempt(wf: Workflow[In], registry: Registry, compensate: bool = False) -> Any:
    """One attempt of stage ``a`` on an event loop of its own (a SystemExit that escapes to
    the loop ends ``asyncio.run`` with it, as it ends a worker's loop)."""
    runner = StageRunner(registry)
    req = StageRequest(run_id="r", workflow=wf, stage_id="a", attempt=1, input={})

    async def go() -> Any:
        if compensate:
            return await runner.compensate(req, 1, InMemoryLedger())
        outcome = await runner.run(req, InMemoryLedger())
        await asyncio.sleep(0.05)  # the loop is still alive after the attempt
        return outcome

    try:
        return asyncio.run(go())
    finally:
        runner.close()


@pytest.mark.parametrize("call", list(CALLS))
def test_system_exit_from_user_code_a_sync_stage_calls_fails_the_attempt(call: str) -> None:
    wf = _sync_stage(CALLS[call])
    registry = Registry([wf])
    registry.register_hook("h", _exit, name="exits")
    outcome = _attempt(wf, registry)
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.type == "StageExitError"
    assert "SystemExit(3)" in outcome.error.message


def test_system_exit_from_a_step_of_a_sync_compensation_fails_the_compensation() -> None:
    wf = Workflow("wf", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @a.compensation
    def undo(ctx: StageContext[In], output: int) -> None:
        ctx.sync_step.run("s", _exit)

    outcome = _attempt(wf, Registry([wf]), compensate=True)
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.type == "StageExitError"


def test_a_sync_step_that_returns_still_returns() -> None:
    wf = _sync_stage(lambda ctx: ctx.sync_step.run("s", lambda: 5))
    outcome = _attempt(wf, Registry([wf]))
    assert isinstance(outcome, Completed) and outcome.output == 1
