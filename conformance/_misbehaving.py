"""Scenario: stage bodies that misbehave in ways ``except Exception`` does not see (DESIGN §5:
a stage's failure is a failed attempt, never a stuck run).

A body that raises an exception with a multi-megabyte message, one whose ``__str__`` raises,
a ``CancelledError`` or ``GeneratorExit`` of its own (nothing cancelled it), each left the run
``running`` for ever on one driver or both; a context that leaked out of the body (a task it
did not await) journaled into an attempt that was over on Temporal and got an engine-internal
error on native. Each now fails the attempt (the run ends ``failed`` with a readable error),
and a leaked context's steps raise ``StepError``, on every driver.

The other user code the engine runs misbehaves the same ways: a compensation doing so fails
the compensation (recorded, the run ends ``failed``), never leaves the run ``compensating``;
a step function, hook handler or ``wait_for`` check raising ``SystemExit`` through the
blocking forms of a sync stage (``ctx.sync_step``, ``ctx.hook_sync``: run as a task of the
engine's loop) stopped the worker's event loop, and now fails the attempt.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from engine_port import MemorySink, Registry, Retry, RunStatus, StageContext, Workflow
from engine_port.errors import NonRetryableError, StepError

from ._harness import CONTRACT_MARKS, Harness, eventually, unique_id

__all__ = ["MisbehavingBodyContract"]

ONCE = Retry(max_attempts=1, initial_interval=timedelta(0))


class In(BaseModel):
    pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


async def _huge(ctx: StageContext[In]) -> None:
    raise ValueError("x" * 3_000_000)


async def _unprintable(ctx: StageContext[In]) -> None:
    raise Unprintable()


async def _own_cancel(ctx: StageContext[In]) -> None:
    task = asyncio.ensure_future(asyncio.sleep(10))
    task.cancel()
    await task  # raises CancelledError here, though nobody cancelled the stage


async def _generator_exit(ctx: StageContext[In]) -> None:
    raise GeneratorExit()


def _sync_generator_exit(ctx: StageContext[In]) -> None:
    raise GeneratorExit()


BODIES = {
    "huge": _huge,
    "unprintable": _unprintable,
    "own-cancel": _own_cancel,
    "generator-exit": _generator_exit,
    "sync-generator-exit": _sync_generator_exit,
}


def _exit(*args: Any) -> None:
    raise SystemExit(3)


COMPENSATIONS: dict[str, Callable[[StageContext[In]], Any]] = {
    "huge": _huge,
    "unprintable": _unprintable,
    "own-cancel": _own_cancel,
    "sync-generator-exit": _sync_generator_exit,
}


def _compensating(kind: str) -> Workflow[In]:
    """Stage ``a`` completes, ``b`` fails for good: ``a``'s compensation misbehaves."""
    wf = Workflow(unique_id(f"misbehaving-undo-{kind}"), input=In)

    @wf.stage(retry=ONCE)
    async def a(ctx: StageContext[In]) -> int:
        return 1

    body = COMPENSATIONS[kind]

    async def undo(ctx: StageContext[In], output: int) -> None:
        await body(ctx)

    def sync_undo(ctx: StageContext[In], output: int) -> None:
        body(ctx)

    a.compensation(undo if inspect.iscoroutinefunction(body) else sync_undo)

    @wf.stage(after=[a], retry=ONCE)
    async def b(ctx: StageContext[In]) -> int:
        raise NonRetryableError("b broke")

    return wf


def _sync_exiting(kind: str, hook: str) -> Workflow[In]:
    """A sync stage whose step function or hook handler raises ``SystemExit``."""
    wf = Workflow(unique_id(f"misbehaving-{kind}"), input=In, hooks=[hook])

    @wf.stage(id="only", retry=ONCE)
    def only(ctx: StageContext[In]) -> int:
        if kind == "sync-step-exit":
            ctx.sync_step.run("s", _exit)
        else:
            ctx.hook_sync(hook, {})
        return 1

    return wf


def _failing(kind: str) -> Workflow[In]:
    wf = Workflow(unique_id(f"misbehaving-{kind}"), input=In)
    wf.stage(id="only", retry=ONCE)(BODIES[kind])
    return wf


class MisbehavingBodyContract:
    """A stage body's misbehaviour fails its attempt; it never leaves the run running."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_bodies_that_raise_what_except_exception_misses_fail_the_run(
        self, harness: Harness
    ) -> None:
        flows = {kind: _failing(kind) for kind in BODIES}
        async with (
            harness.engine(Registry(list(flows.values())), MemorySink()) as engine,
            engine.worker(),
        ):
            runs = {kind: await engine.start(wf.id, {}) for kind, wf in flows.items()}
            ended = {k: await engine.wait(r.id, timeout=60) for k, r in runs.items()}
        for kind, info in ended.items():
            assert info.status == RunStatus.FAILED, kind
            assert info.error is not None, kind
        huge = ended["huge"].error
        assert huge is not None and huge.type == "ValueError"
        assert len(huge.message) < 10_000 and "more characters cut" in huge.message
        unprintable = ended["unprintable"].error
        assert unprintable is not None and unprintable.type == "Unprintable"
        assert "str() raised RuntimeError" in unprintable.message
        for kind in ("own-cancel", "generator-exit", "sync-generator-exit"):
            error = ended[kind].error
            assert error is not None and error.type == "StageExitError", kind
            assert "nothing cancelled it" in error.message, kind

    async def test_compensations_and_sync_steps_that_raise_what_except_exception_misses(
        self, harness: Harness
    ) -> None:
        hook = unique_id("exit-hook")
        undos = {kind: _compensating(kind) for kind in COMPENSATIONS}
        exits = {kind: _sync_exiting(kind, hook) for kind in ("sync-step-exit", "hook-sync-exit")}
        registry = Registry([*undos.values(), *exits.values()])
        registry.register_hook(hook, _exit, name="exits")
        async with harness.engine(registry, MemorySink()) as engine, engine.worker():
            started = {k: await engine.start(wf.id, {}) for k, wf in {**undos, **exits}.items()}
            ended = {k: await engine.wait(r.id, timeout=60) for k, r in started.items()}
        types = {
            "huge": "ValueError",
            "unprintable": "Unprintable",
            "own-cancel": "StageExitError",
            "sync-generator-exit": "StageExitError",
        }
        for kind, want in types.items():
            info = ended[kind]
            assert info.status == RunStatus.FAILED, kind
            assert [e.type for e in info.compensation_errors] == [want], kind
            assert len(info.compensation_errors[0].message) < 10_000, kind
        unprintable = ended["unprintable"].compensation_errors[0]
        assert "str() raised RuntimeError" in unprintable.message
        for kind in exits:
            info = ended[kind]
            assert info.status == RunStatus.FAILED, kind
            assert info.error is not None and info.error.type == "StageExitError", kind
            assert "SystemExit(3)" in info.error.message, kind

    async def test_a_step_of_a_context_that_leaked_out_of_its_stage_raises(
        self, harness: Harness
    ) -> None:
        wf = Workflow(unique_id("leaky"), input=In)
        leaked: list[BaseException | Any] = []
        go = asyncio.Event()

        async def late(ctx: StageContext[In]) -> None:
            await go.wait()
            try:
                leaked.append(await ctx.step.run("late", lambda: 1))
            except BaseException as exc:  # (what the user's task would see)
                leaked.append(exc)

        tasks: list[asyncio.Task[None]] = []

        @wf.stage
        async def only(ctx: StageContext[In]) -> str:
            tasks.append(asyncio.create_task(late(ctx)))  # not awaited: leaks ctx
            return "done"

        async with (
            harness.engine(Registry([wf]), MemorySink()) as engine,
            engine.worker(),
        ):
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            go.set()
            await eventually(lambda: leaked, what="the leaked task's step")
        assert info.status == RunStatus.COMPLETED
        assert isinstance(leaked[0], StepError), leaked
        assert "after its stage attempt ended" in str(leaked[0])
