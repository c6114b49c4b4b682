"""The traceback a failed stage or compensation records (ErrorInfo.traceback): the user's
frames from the stage function down to the raise, bounded, without the engine's frames."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from engine_port import (
    Failed,
    InMemoryLedger,
    Registry,
    StageContext,
    StageRequest,
    StageRunner,
    Workflow,
)
from engine_port._tracebacks import format_user_traceback

HERE = str(Path(__file__).resolve())


class In(BaseModel):
    n: int = 0


def _lookup(data: dict[str, int]) -> int:
    return data["missing_key"]


def _flow() -> Workflow[In]:
    wf: Workflow[In] = Workflow("tb", input=In)

    @wf.stage
    async def in_a_step(ctx: StageContext[In]) -> int:
        return int(await ctx.step.run("look", _lookup, {"a": 1}))

    @wf.stage
    def sync_body(ctx: StageContext[In]) -> int:
        return _lookup({})

    @wf.stage
    async def undo(ctx: StageContext[In]) -> int:
        return 1

    @undo.compensation
    async def undo_it(ctx: StageContext[In], output: int) -> None:
        raise ValueError(f"cannot release {output}")

    return wf


async def _fail(stage: str, compensate: bool = False) -> Failed:
    wf = _flow()
    runner = StageRunner(Registry([wf]))
    req = StageRequest("r1", wf, stage, 1, {"n": 1})
    try:
        if compensate:
            outcome: Any = await runner.compensate(req, 1, InMemoryLedger())
        else:
            outcome = await runner.run(req, InMemoryLedger())
    finally:
        runner.close()
    assert isinstance(outcome, Failed)
    return outcome


async def test_a_raise_inside_a_step_keeps_the_stage_and_the_step_function() -> None:
    tb = (await _fail("in_a_step")).error.traceback
    assert tb is not None
    lines = tb.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith(f'  File "{HERE}"') and lines[1].endswith("in in_a_step")
    assert "in _lookup" in tb and 'return data["missing_key"]' in tb
    assert lines[-1] == "KeyError: 'missing_key'"


async def test_a_sync_body_records_no_thread_pool_frames() -> None:
    tb = (await _fail("sync_body")).error.traceback
    assert tb is not None
    assert "concurrent" not in tb and "engine_port" not in tb
    assert tb.splitlines()[1].endswith("in sync_body")


async def test_a_failing_compensation_records_its_traceback() -> None:
    err = (await _fail("undo", compensate=True)).error
    assert err.type == "ValueError" and err.traceback is not None
    assert "in undo_it" in err.traceback and "ValueError: cannot release 1" in err.traceback


def _deep(n: int) -> None:
    if n == 0:
        raise RuntimeError("at the bottom")
    _deep(n - 1)


def test_a_long_traceback_keeps_the_innermost_frames_within_the_bound() -> None:
    try:
        _deep(200)
    except RuntimeError as exc:
        tb = format_user_traceback(exc, _deep, limit=400)
    assert tb is not None and len(tb) <= 400
    assert "earlier frame(s) left out" in tb
    assert 'raise RuntimeError("at the bottom")' in tb
    assert tb.endswith("RuntimeError: at the bottom\n")
