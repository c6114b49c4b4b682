"""Hook handlers at their edges, the same on every driver: one that raises fails the attempt
under the retry policy (handlers that had completed are not run again), a non-JSON result or
an undeclared hook point fails the stage for good, a slow one meets the stage timeout, and a
hook called by a compensation is journaled under it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from engine_port import (
    MemorySink,
    NonRetryableError,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, unique_id, wait_for_events
from ._models import Num

__all__ = ["HookEdgeContract", "run_to", "trace_of"]

FAST = Retry(max_attempts=3, initial_interval=timedelta(milliseconds=50), backoff=1.0)


def trace_of(events: list[Any]) -> list[tuple[Any, ...]]:
    """Events as (type, stage), a failure with its attempt, error type and retry."""
    out: list[tuple[Any, ...]] = []
    for e in events:
        if e.type == "stage.failed":
            d = e.data
            out.append((e.type, e.stage, d["attempt"], d["error"]["type"], d["will_retry"]))
        else:
            out.append((e.type, e.stage))
    return out


async def run_to(
    harness: Harness, registry: Registry, wf: Workflow[Any], until: str, sink: Any = None
) -> tuple[Any, list[Any]]:
    sink = sink if sink is not None else MemorySink()
    async with harness.engine(registry, sink) as engine, engine.worker():
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=60)
        events = await wait_for_events(sink, run.id, until, timeout=30)
    return info, events


class HookEdgeContract:
    """Hook handlers that raise, return a non-JSON value, are slow or sit in a compensation."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_hook_handler_that_raises_fails_the_attempt(
        self, harness: Harness, tmp_path: Path
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
        info, events = await run_to(harness, registry, wf, "run.completed")
        assert info.status == RunStatus.COMPLETED and info.output == [1, 2]
        assert log.counts() == {"first": 1, "flaky": 3}
        assert trace_of(events)[2:] == [
            ("stage.started", "a"),
            ("stage.failed", "a", 1, "RuntimeError", True),
            ("stage.started", "a"),
            ("stage.failed", "a", 2, "RuntimeError", True),
            ("stage.started", "a"),
            ("stage.completed", "a"),
            ("run.completed", None),
        ]

    async def test_hook_bad_results_and_undeclared_hooks(self, harness: Harness) -> None:
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
        info, events = await run_to(harness, registry, wf, "run.failed")
        assert info.stage("a").output == []
        assert info.error is not None and (info.error.type, info.error.stage) == (
            "SerializationError",
            "b",
        )
        assert ("stage.failed", "b", 1, "SerializationError", False) in trace_of(events)

        undeclared = Workflow(unique_id("hookundeclared"), input=Num)

        @undeclared.stage(retry=FAST)
        async def c(ctx: StageContext[Num]) -> list[Any]:
            return await ctx.hook("nobody.declared.me", {})

        info, events = await run_to(harness, Registry([undeclared]), undeclared, "run.failed")
        assert info.error is not None and info.error.type == "StepError"
        assert "hook_point" in info.error.message
        assert ("stage.failed", "c", 1, "StepError", False) in trace_of(events)

    async def test_slow_hook_handler_hits_the_stage_timeout(self, harness: Harness) -> None:
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
        info, events = await run_to(harness, registry, wf, "run.failed")
        assert info.error is not None and info.error.type == "StageTimeoutError"
        assert trace_of(events)[2:] == [
            ("stage.started", "a"),
            ("stage.failed", "a", 1, "StageTimeoutError", True),
            ("stage.started", "a"),
            ("stage.failed", "a", 2, "StageTimeoutError", False),
            ("run.failed", None),
        ]

    async def test_hook_in_a_compensation_is_journaled_under_it(self, harness: Harness) -> None:
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
        assert trace_of(events)[-2:] == [("stage.compensated", "a"), ("run.failed", None)]
