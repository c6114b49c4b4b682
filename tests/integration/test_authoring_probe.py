"""Stage bodies written wrongly, run on the native SQLite driver: each ends the run failed
with an EngineError that says what to do (not retried), or works as the user meant."""

from __future__ import annotations

from collections.abc import Callable
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
    RunInfo,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)


class In(BaseModel):
    n: int = 0


RETRY = Retry(max_attempts=3, initial_interval=timedelta(milliseconds=10))


async def run_one(tmp_path: Path, wf: Workflow[In], sink: MemorySink | None = None) -> RunInfo:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'blobs'}"
    )
    engine = create_engine(settings, Registry([wf]), event_sink=sink)
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            return await engine.wait(run.id, timeout=20)


async def test_a_step_function_may_take_keyword_arguments_named_name_or_fn(
    tmp_path: Path,
) -> None:
    # before: TypeError "Steps.run() got multiple values for argument 'name'", retried
    wf = Workflow("kw", input=In)

    def greet(*, name: str, fn: str) -> str:
        return f"{name}/{fn}"

    @wf.stage(retry=RETRY)
    async def a(ctx: StageContext[In]) -> str:
        result: str = await ctx.step.run("greet", greet, name="ann", fn="f")
        return result

    @wf.stage(after=[a], retry=RETRY)
    def b(ctx: StageContext[In]) -> str:  # the same through sync_step
        result: str = ctx.sync_step.run("greet", greet, name="bob", fn="g")
        return result

    info = await run_one(tmp_path, wf)
    assert info.status == RunStatus.COMPLETED, info.error
    assert info.output == "bob/g"
    assert {s.id: s.output for s in info.stages}["a"] == "ann/f"


@pytest.mark.parametrize("event_type", ["run.completed", "run.failed", "stage.completed"])
async def test_emitting_a_lifecycle_event_type_fails_the_stage_at_once(
    tmp_path: Path, event_type: str
) -> None:
    # before: the run completed and the sink carried a second "run.completed" (or a
    # "run.failed" for a run that completed), business=True, after the engine's own
    wf = Workflow("reserved", input=In)

    @wf.stage(retry=RETRY)
    async def a(ctx: StageContext[In]) -> int:
        ctx.emit(event_type, {"n": 1})
        return 1

    sink = MemorySink()
    info = await run_one(tmp_path, wf, sink)
    assert info.status == RunStatus.FAILED
    assert info.error is not None and info.error.type == "StepError"
    assert "lifecycle event type" in info.error.message
    assert "name of your own" in info.error.message
    assert [s.attempt for s in info.stages] == [1]  # never retried
    assert not [e for e in sink.for_run(info.id) if e.business]


async def test_business_event_types_near_the_lifecycle_ones_are_fine(tmp_path: Path) -> None:
    wf = Workflow("near", input=In)

    @wf.stage(retry=RETRY)
    async def a(ctx: StageContext[In]) -> int:
        for t in ("run.completed.audit", "order.completed", "stage", "run"):
            ctx.emit(t, {})
        return 1

    sink = MemorySink()
    info = await run_one(tmp_path, wf, sink)
    assert info.status == RunStatus.COMPLETED, info.error
    business: list[Any] = [e.type for e in sink.for_run(info.id) if e.business]
    assert business == ["run.completed.audit", "order.completed", "stage", "run"]


async def test_an_output_whose_dict_keys_collide_in_json_fails_without_retry(
    tmp_path: Path,
) -> None:
    # before: the run completed with output {"1": "b"}: the value of key 1 was lost
    wf = Workflow("collide", input=In)

    @wf.stage(retry=RETRY)
    async def a(ctx: StageContext[In]) -> Any:
        return {1: "a", "1": "b"}

    info = await run_one(tmp_path, wf)
    assert info.status == RunStatus.FAILED
    assert info.error is not None and info.error.type == "SerializationError"
    assert "keys 1 and '1'" in info.error.message
    assert [s.attempt for s in info.stages] == [1]


@pytest.mark.parametrize("call", ["run", "sleep", "wait_for_signal", "wait_for", "hook"])
async def test_an_awaitable_step_called_in_a_sync_stage_says_to_use_the_blocking_form(
    tmp_path: Path, call: str
) -> None:
    # before: the coroutine was never awaited (a RuntimeWarning): the step silently never
    # ran and the stage completed (or failed on the coroutine it got instead of a result)
    wf = Workflow("sync-misuse", input=In, hooks=["h"])
    ran: list[str] = []

    @wf.stage(retry=RETRY, signals=["go"])
    def a(ctx: StageContext[In]) -> int:
        calls: dict[str, Callable[[], object]] = {
            "run": lambda: ctx.step.run("x", ran.append, "x"),
            "sleep": lambda: ctx.step.sleep("nap", 0),
            "wait_for_signal": lambda: ctx.step.wait_for_signal("go"),
            "wait_for": lambda: ctx.step.wait_for("poll", lambda: True),
            "hook": lambda: ctx.hook("h", {}),
        }
        _ = calls[call]()  # not awaited: a sync body cannot
        return 1

    info = await run_one(tmp_path, wf)
    assert info.status == RunStatus.FAILED, info.output
    assert info.error is not None and info.error.type == "StepError"
    blocking = "ctx.hook_sync" if call == "hook" else f"ctx.sync_step.{call}"
    assert f"use the blocking form {blocking}(...)" in info.error.message
    assert [s.attempt for s in info.stages] == [1] and ran == []


async def test_the_blocking_steps_of_a_sync_stage_and_awaitable_ones_of_an_async_step_work(
    tmp_path: Path,
) -> None:
    wf = Workflow("sync-ok", input=In, hooks=["h"])
    wf.hook_point("h")

    @wf.stage(retry=RETRY)
    def a(ctx: StageContext[In]) -> list[Any]:
        x = ctx.sync_step.run("x", lambda: 1)
        ctx.sync_step.sleep("nap", 0)
        return [x, ctx.sync_step.wait_for("poll", lambda: 2)]

    @wf.stage(after=[a], retry=RETRY)
    async def b(ctx: StageContext[In]) -> Any:
        async def nested() -> int:  # an async step function may use the awaitable steps
            return int(await ctx.step.run("inner", lambda: 3))

        def wrapper() -> Any:  # a sync wrapper returning the coroutine, run on the loop
            return nested()

        return [ctx.output_of(a), await ctx.step.run("outer", wrapper)]

    info = await run_one(tmp_path, wf)
    assert info.status == RunStatus.COMPLETED, info.error
    assert info.output == [[1, 2], 3]


async def test_a_step_result_that_does_not_match_its_annotation_fails_without_retries(
    tmp_path: Path,
) -> None:
    """The result is journaled before it is checked, so every retry replayed it and failed
    the same way (a pydantic ValidationError, retried until the attempts ran out)."""
    wf = Workflow("bad-step-type", input=In)
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return "many"  # type: ignore[return-value]

    @wf.stage(retry=RETRY)
    async def a(ctx: StageContext[In]) -> int:
        result: int = await ctx.step.run("count", count)
        return result

    info = await run_one(tmp_path, wf)
    assert info.status == RunStatus.FAILED
    stage = info.stages[0]
    assert stage.attempt == 1 and calls == [1]
    assert info.error is not None and info.error.type == "SerializationError"
    assert "result of step 'count' does not match its return annotation" in info.error.message
    assert "redrive" in info.error.message
