"""Events, event sinks and hooks, run on the native driver (SQLite) and on Temporal: what both
drivers agree on and the contract classes covered thinly (hook handlers that raise, return a
non-JSON value, are slow, or are missing; hooks inside compensations; a torn JSONL line).
Business events staged inside steps and hooks: ``conformance/_flow.py`` (S15)."""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conformance import ExecutionLog, SettingsHarness, unique_id, wait_for_events
from conformance._models import Num
from engine_port import (
    EngineSettings,
    JsonlFileSink,
    MemorySink,
    NonRetryableError,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)

FAST = Retry(max_attempts=3, initial_interval=timedelta(milliseconds=50), backoff=1.0)


@pytest.fixture(params=["native-sqlite", pytest.param("temporal", marks=pytest.mark.temporal)])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> SettingsHarness:
    """The two drivers' harnesses, as tests/conformance/test_*_conformance.py build them."""
    if request.param == "native-sqlite":
        settings = EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
            blob_url=f"file://{tmp_path / 'blobs'}",
            lease_seconds=3.0,
        )
        return SettingsHarness(settings, name="native-sqlite")
    server = request.getfixturevalue("temporal_server")
    settings = EngineSettings(
        driver="temporal",
        temporal_address=server.address,
        task_queue=f"c-{uuid.uuid4().hex[:10]}",
        blob_url=f"file://{tmp_path / 'blobs'}",
    )
    return SettingsHarness(settings, name="temporal")


def _trace(events: list[Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for e in events:
        if e.type == "stage.failed":
            d = e.data
            out.append((e.type, e.stage, d["attempt"], d["error"]["type"], d["will_retry"]))
        else:
            out.append((e.type, e.stage))
    return out


async def _run(
    harness: SettingsHarness, registry: Registry, wf: Workflow[Any], until: str, sink: Any = None
) -> tuple[Any, list[Any]]:
    sink = sink if sink is not None else MemorySink()
    async with harness.engine(registry, sink) as engine, engine.worker():
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=60)
        events = await wait_for_events(sink, run.id, until, timeout=30)
    return info, events


# -- event sinks ---------------------------------------------------------------------------


async def test_jsonl_sink_survives_a_torn_line(harness: SettingsHarness, tmp_path: Path) -> None:
    """A worker that died mid-append (or one still appending) leaves a line without its end.
    The next events must still be readable: ``for_run`` used to fail on the fragment with a
    ValidationError, and the next append glued ``run.created`` onto it (lost for readers)."""
    path = tmp_path / "events.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b'{"id":"0f","run_id":"another-run","seq":1,"ty')  # a writer killed here
    os.close(fd)
    sink = JsonlFileSink(path)
    wf = Workflow(unique_id("jsonl"), input=Num)

    @wf.stage
    async def a(ctx: StageContext[Num]) -> str:
        ctx.emit("order.noted", {"who": "Zoë ✓"})  # non-ASCII data round-trips
        return "done"

    info, events = await _run(harness, Registry([wf]), wf, "run.completed", sink=sink)
    assert info.status == RunStatus.COMPLETED
    assert [e.type for e in events] == [
        "run.created",
        "run.started",
        "stage.started",
        "stage.completed",
        "order.noted",
        "run.completed",
    ]
    assert events[4].data == {"who": "Zoë ✓"}
    # a line being appended right now (no newline yet) is not read as a broken file
    with path.open("ab") as f:
        f.write(b'{"id":"1f","run_id":"')
    assert [e.type for e in sink.for_run(info.id)] == [e.type for e in events]


# -- hooks --------------------------------------------------------------------------------


async def test_hook_handler_that_raises_fails_the_attempt(
    harness: SettingsHarness, tmp_path: Path
) -> None:
    """A raising handler fails the stage attempt like any user error (retry policy applies);
    the handlers that had completed are durable steps and do not run again."""
    log = ExecutionLog(tmp_path / "log")
    wf = Workflow(unique_id("hookraise"), input=Num, hooks=["h"])

    @wf.stage(retry=FAST)
    async def a(ctx: StageContext[Num]) -> list[Any]:
        return await ctx.hook("h", {"n": 1})

    registry = Registry([wf])

    def first(ctx: StageContext[Num], payload: dict[str, int]) -> int:
        log.hit("first")
        return 1

    def flaky(ctx: StageContext[Num], payload: dict[str, int]) -> int:
        log.hit("flaky")
        if log.count("flaky") < 3:
            raise RuntimeError("hook down")
        return 2

    registry.register_hook("h", first)
    registry.register_hook("h", flaky)
    info, events = await _run(harness, registry, wf, "run.completed")
    assert info.status == RunStatus.COMPLETED and info.output == [1, 2]
    assert log.counts() == {"first": 1, "flaky": 3}
    assert _trace(events)[2:] == [
        ("stage.started", "a"),
        ("stage.failed", "a", 1, "RuntimeError", True),
        ("stage.started", "a"),
        ("stage.failed", "a", 2, "RuntimeError", True),
        ("stage.started", "a"),
        ("stage.completed", "a"),
        ("run.completed", None),
    ]


async def test_hook_bad_results_and_undeclared_hooks(harness: SettingsHarness) -> None:
    """A handler returning a non-JSON value fails its stage with SerializationError, not
    retried; calling a hook point the workflow does not declare fails with StepError, not
    retried; a declared hook point without handlers returns []."""
    wf = Workflow(unique_id("hookbad"), input=Num, hooks=["h", "empty"])

    @wf.stage(retry=FAST)
    async def a(ctx: StageContext[Num]) -> list[Any]:
        return await ctx.hook("empty", 1)

    @wf.stage(after=[a], retry=FAST)
    async def b(ctx: StageContext[Num]) -> list[Any]:
        return await ctx.hook("h", {})

    registry = Registry([wf])
    registry.register_hook("h", lambda ctx, payload: object(), name="opaque")
    info, events = await _run(harness, registry, wf, "run.failed")
    assert info.stage("a").output == []
    assert info.error is not None and (info.error.type, info.error.stage) == (
        "SerializationError",
        "b",
    )
    assert ("stage.failed", "b", 1, "SerializationError", False) in _trace(events)

    undeclared = Workflow(unique_id("hookundeclared"), input=Num)

    @undeclared.stage(retry=FAST)
    async def c(ctx: StageContext[Num]) -> list[Any]:
        return await ctx.hook("nobody.declared.me", {})

    info, events = await _run(harness, Registry([undeclared]), undeclared, "run.failed")
    assert info.error is not None and info.error.type == "StepError"
    assert "hook_point" in info.error.message
    assert ("stage.failed", "c", 1, "StepError", False) in _trace(events)


async def test_slow_hook_handler_hits_the_stage_timeout(harness: SettingsHarness) -> None:
    wf = Workflow(unique_id("hookslow"), input=Num, hooks=["h"])

    @wf.stage(
        retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)),
        timeout=timedelta(seconds=1),
    )
    async def a(ctx: StageContext[Num]) -> list[Any]:
        return await ctx.hook("h", {})

    registry = Registry([wf])

    async def slow(ctx: StageContext[Num], payload: Any) -> int:
        await asyncio.sleep(30)
        return 1

    registry.register_hook("h", slow)
    info, events = await _run(harness, registry, wf, "run.failed")
    assert info.error is not None and info.error.type == "StageTimeoutError"
    assert _trace(events)[2:] == [
        ("stage.started", "a"),
        ("stage.failed", "a", 1, "StageTimeoutError", True),
        ("stage.started", "a"),
        ("stage.failed", "a", 2, "StageTimeoutError", False),
        ("run.failed", None),
    ]


async def test_hook_in_a_compensation_is_journaled_under_it(harness: SettingsHarness) -> None:
    wf = Workflow(unique_id("hookcomp"), input=Num, hooks=["undo"])

    @wf.stage
    async def a(ctx: StageContext[Num]) -> int:
        return 1

    @a.compensation
    async def undo_a(ctx: StageContext[Num], output: int) -> None:
        await ctx.hook("undo", {"output": output})

    @wf.stage(after=[a])
    async def b(ctx: StageContext[Num]) -> int:
        raise NonRetryableError("b is broken")

    registry = Registry([wf])
    seen: list[Any] = []
    registry.register_hook("undo", lambda ctx, payload: seen.append(payload), name="audit")
    sink = MemorySink()
    async with harness.engine(registry, sink) as engine, engine.worker():
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=60)
        events = await wait_for_events(sink, run.id, "run.failed")
        steps = await engine.steps(run.id)
    assert info.stage("a").status == "compensated" and seen == [{"output": 1}]
    assert [(s.stage, s.name) for s in steps] == [("a#compensation", "hook:undo:0:audit")]
    assert _trace(events)[-2:] == [("stage.compensated", "a"), ("run.failed", None)]
