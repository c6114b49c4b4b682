"""S3 retries, S4 compensation, S5 failing compensation, S16 bad input."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from pydantic import BaseModel

from engine_port import MemorySink, NonRetryableError, Registry, Retry, StageContext, Workflow
from engine_port.errors import (
    DefinitionError,
    InvalidInputError,
    RunNotFoundError,
    WorkflowNotFoundError,
)

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


async def test_s3_retries_with_backoff(make_engine: EngineFactory) -> None:
    wf = Workflow("retries", input=In)
    starts: list[float] = []

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    @wf.stage(
        after=[a],
        retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=300), backoff=2.0),
    )
    async def b(ctx: StageContext[In]) -> int:
        starts.append(time.monotonic())
        if ctx.attempt < 3:
            raise RuntimeError(f"flaky {ctx.attempt}")
        return ctx.attempt

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("retries", {})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed"
    assert info.output == 3
    assert len(starts) == 3
    gaps = [starts[1] - starts[0], starts[2] - starts[1]]
    assert 0.28 <= gaps[0] < 1.5, gaps
    assert 0.58 <= gaps[1] < 2.0, gaps
    events = [
        (e.type, e.stage, e.data.get("attempt"), e.data.get("will_retry"))
        for e in sink.for_run(run.id)
    ]
    assert events[4:11] == [
        ("stage.started", "b", 1, None),
        ("stage.failed", "b", 1, True),
        ("stage.started", "b", 2, None),
        ("stage.failed", "b", 2, True),
        ("stage.started", "b", 3, None),
        ("stage.completed", "b", 3, None),
        ("run.completed", None, None, None),
    ]
    assert info.stage("b").attempt == 3


def saga(fail_comp: bool = False) -> tuple[Workflow[In], list[str]]:
    log: list[str] = []
    wf = Workflow("saga", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        ctx.emit("a.done", {"x": 1})
        return "A"

    @a.compensation
    async def undo_a(ctx: StageContext[In], out: str) -> None:
        log.append(f"undo-a:{out}")
        if fail_comp:
            raise RuntimeError("cannot undo a")

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        return "B"

    @b.compensation
    async def undo_b(ctx: StageContext[In], out: str) -> None:
        log.append(f"undo-b:{out}")

    @wf.stage(after=[b], retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)))
    async def c(ctx: StageContext[In]) -> str:
        raise NonRetryableError("card declined")

    @wf.stage(after=[c])
    async def d(ctx: StageContext[In]) -> str:
        return "D"

    return wf, log


async def test_s4_failure_compensates_in_reverse(make_engine: EngineFactory) -> None:
    wf, log = saga()
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("saga", {})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "failed"
    assert info.error is not None
    assert info.error.stage == "c" and "card declined" in info.error.message
    assert info.error.type == "NonRetryableError"
    assert {s.id: s.status for s in info.stages} == {
        "a": "compensated",
        "b": "compensated",
        "c": "failed",
        "d": "skipped",
    }
    assert log == ["undo-b:B", "undo-a:A"]
    assert trace(sink, run)[2:] == [
        ("stage.started", "a"),
        ("stage.completed", "a"),
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("stage.started", "c"),
        ("stage.failed", "c"),
        ("stage.compensated", "b"),
        ("stage.compensated", "a"),
        ("run.failed", None),
    ]
    failed = next(e for e in sink.for_run(run.id) if e.type == "stage.failed")
    assert failed.data["will_retry"] is False
    assert not any(e.business for e in sink.events)


async def test_s5_failing_compensation_keeps_original_error(make_engine: EngineFactory) -> None:
    wf, log = saga(fail_comp=True)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("saga", {})
        info = await engine.wait(run.id, timeout=60)
    assert info.status == "failed"
    assert info.error is not None and info.error.stage == "c"
    assert info.error.message == "card declined"
    assert len(info.compensation_errors) == 1
    assert "cannot undo a" in info.compensation_errors[0].message
    a = info.stage("a")
    assert a.status == "completed"
    assert a.compensation_error is not None and "cannot undo a" in a.compensation_error.message
    assert info.stage("b").status == "compensated"
    assert trace(sink, run)[-2:] == [("stage.compensated", "b"), ("run.failed", None)]
    assert log.count("undo-b:B") == 1
    assert log.count("undo-a:A") == 3  # the stage's Retry (max_attempts=3 default)


async def test_s16_bad_input_is_typed_and_writes_nothing(make_engine: EngineFactory) -> None:
    wf = Workflow("typed", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> object:
        return object()  # not JSON

    @a.compensation
    async def undo(ctx: StageContext[In], out: object) -> None:
        pass

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> int:
        return 1

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine:
        with pytest.raises(WorkflowNotFoundError):
            await engine.start("nope", {})
        with pytest.raises(InvalidInputError) as bad:
            await engine.start("typed", {"n": "not a number"})
        assert "n" in bad.value.fields
        for call in (
            engine.get_run("no-such-run"),
            engine.cancel("no-such-run"),
            engine.signal("no-such-run", "go", {}),
        ):
            with pytest.raises(RunNotFoundError):
                await call
        assert await engine.list_runs(workflow_id="typed") == []
        with pytest.raises(DefinitionError):
            cyc = Workflow("cyc", input=In)
            cyc.stage(lambda ctx: 1, id="x", after=["y"])
            cyc.stage(lambda ctx: 1, id="y", after=["x"])
            Registry([cyc])
        async with engine.worker():
            run = await engine.start("typed", {"n": 1})
            info = await engine.wait(run.id, timeout=30)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "SerializationError"
    assert info.stage("a").status == "failed" and info.stage("a").attempt == 1
    assert info.stage("b").status == "skipped"


async def test_cancel_before_the_first_workflow_task_still_ends_through_finish(
    make_engine: EngineFactory,
) -> None:
    """A cancel that reaches the run with its first workflow task (no worker was up) ends the
    run cancelled with its state saved, so it can be redriven."""
    wf = Workflow("cancel-early", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return 1

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"cancel_wait": 0.2})
    async with engine:
        run = await engine.start("cancel-early", {})
        await engine.cancel(run.id)  # no worker yet: the request waits in the history
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
            assert info.status == "cancelled" and info.error is None
            again = await engine.redrive(run.id, from_="start")
            assert again.redrive_count == 1
            done = await engine.wait(run.id, timeout=30)
    assert done.status == "completed" and done.output == 1
    assert ("run.cancelled", None) in trace(sink, run)
