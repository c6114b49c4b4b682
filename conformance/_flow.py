"""Scenarios: graphs, outputs, retries, sleeps, hooks, claim check (SCENARIOS S1-S3, S6,
S14, S15)."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    MemorySink,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, unique_id, wait_for_events
from ._models import Num
from ._trace import check_golden, normalise, run_summary

__all__ = ["ClaimCheckContract", "FlowContract", "HookContract", "RetryContract", "SleepContract"]

FAST = Retry(max_attempts=3, initial_interval=timedelta(milliseconds=100), backoff=2.0)


class Doubled(BaseModel):
    value: int


async def _run(
    harness: Harness,
    wf: Workflow[Any],
    payload: Any,
    until: str = "run.completed",
    registry: Registry | None = None,
) -> tuple[Any, list[Any]]:
    sink = MemorySink()
    async with harness.engine(registry or Registry([wf]), sink) as engine, engine.worker():
        run = await engine.start(wf.id, payload)
        info = await engine.wait(run.id, timeout=60)
        events = await wait_for_events(sink, run.id, until)
    return info, events


class FlowContract:
    """S1, S2: linear and parallel graphs, outputs passed between stages."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s1_linear(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s1"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> Doubled:
            log.hit("a")
            return Doubled(value=ctx.input.n * 2)

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> int:
            log.hit("b")
            out: Doubled = ctx.output_of(a)
            return out.value + 1

        @wf.stage(after=[b])
        def c(ctx: StageContext[Num]) -> dict[str, int]:  # sync handlers run in a thread
            log.hit("c")
            return {"result": ctx.output_of(b)}

        info, events = await _run(harness, wf, {"n": 5})
        assert info.status == RunStatus.COMPLETED
        assert info.output == {"result": 11}
        assert [s.output for s in info.stages] == [{"value": 10}, 11, {"result": 11}]
        assert log.counts() == {"a": 1, "b": 1, "c": 1}
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "a", 1],
            ["stage.completed", "a", 1],
            ["stage.started", "b", 1],
            ["stage.completed", "b", 1],
            ["stage.started", "c", 1],
            ["stage.completed", "c", 1],
            ["run.completed"],
        ]
        check_golden(
            "s1_linear", {"trace": trace, "run": run_summary(info), "counts": log.counts()}
        )

    async def test_s2_parallel_group(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s2"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            log.hit("a")
            return ctx.input.n

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> int:
            log.hit("b")
            return int(ctx.output_of(a)) + 10

        @wf.stage(after=[a])
        async def c(ctx: StageContext[Num]) -> int:
            log.hit("c")
            return int(ctx.output_of(a)) + 100

        @wf.stage(after=[b, c])
        async def d(ctx: StageContext[Num]) -> list[int]:
            log.hit("d")
            return [ctx.output_of(b), ctx.output_of(c)]

        assert wf.graph().groups == [["a"], ["b", "c"], ["d"]]
        info, events = await _run(harness, wf, {"n": 1})
        assert info.status == RunStatus.COMPLETED
        assert info.output == [11, 101]
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "a", 1],
            ["stage.completed", "a", 1],
            ["stage.started", "b", 1],
            ["stage.completed", "b", 1],
            ["stage.started", "c", 1],
            ["stage.completed", "c", 1],
            ["stage.started", "d", 1],
            ["stage.completed", "d", 1],
            ["run.completed"],
        ]
        # nothing of group k+1 before the last completion of group k
        seq = {(e.type, e.stage): e.seq for e in events}
        assert seq[("stage.started", "d")] > max(
            seq[("stage.completed", "b")], seq[("stage.completed", "c")]
        )
        assert log.counts() == {"a": 1, "b": 1, "c": 1, "d": 1}
        check_golden("s2_parallel", {"trace": trace, "run": run_summary(info)})

    async def test_several_sinks_output(self, harness: Harness) -> None:
        wf = Workflow(unique_id("sinks"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            return 1

        @wf.stage(after=[a])
        async def x(ctx: StageContext[Num]) -> str:
            return "x"

        @wf.stage(after=[a])
        async def y(ctx: StageContext[Num]) -> str:
            return "y"

        info, _ = await _run(harness, wf, {})
        assert info.output == {"x": "x", "y": "y"}


class RetryContract:
    """S3: retries with backoff, attempt counts; exhausted retries fail the run."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s3_retries_then_success(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        starts: list[float] = []
        wf = Workflow(unique_id("s3"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            return 1

        @wf.stage(after=[a], retry=FAST)
        async def b(ctx: StageContext[Num]) -> int:
            log.hit("b")
            starts.append(time.monotonic())
            if ctx.attempt < 3:
                raise RuntimeError(f"flaky {ctx.attempt}")
            return ctx.attempt

        @wf.stage(after=[b])
        async def c(ctx: StageContext[Num]) -> int:
            return int(ctx.output_of(b))

        info, events = await _run(harness, wf, {})
        assert info.status == RunStatus.COMPLETED
        assert info.output == 3
        assert log.count("b") == 3
        gaps = [b2 - b1 for b1, b2 in itertools.pairwise(starts)]
        assert gaps[0] >= 0.09 and gaps[1] >= 0.19, gaps  # 100 ms, then 200 ms
        trace = normalise(events, wf.graph())
        assert trace[4:10] == [
            ["stage.started", "b", 1],
            ["stage.failed", "b", 1, "RuntimeError", True],
            ["stage.started", "b", 2],
            ["stage.failed", "b", 2, "RuntimeError", True],
            ["stage.started", "b", 3],
            ["stage.completed", "b", 3],
        ]
        check_golden(
            "s3_retries", {"trace": trace, "run": run_summary(info), "counts": log.counts()}
        )

    async def test_s3_retries_exhausted(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s3x"), input=Num)

        @wf.stage(retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)))
        async def a(ctx: StageContext[Num]) -> int:
            log.hit("a")
            raise ValueError("always")

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> int:
            log.hit("b")
            return 1

        info, events = await _run(harness, wf, {}, until="run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "ValueError"
        assert info.error.stage == "a" and "always" in info.error.message
        assert log.counts() == {"a": 2}
        assert info.stage("b").status == "skipped"
        trace = normalise(events, wf.graph())
        assert trace[-2:] == [
            ["stage.failed", "a", 2, "ValueError", False],
            ["run.failed", "ValueError", None],
        ]
        check_golden("s3_exhausted", {"trace": trace, "run": run_summary(info)})

    async def test_non_retryable(self, harness: Harness, tmp_path: Path) -> None:
        from engine_port import NonRetryableError

        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("nr"), input=Num)

        class Declined(Exception):
            pass

        @wf.stage(
            retry=Retry(
                max_attempts=5,
                initial_interval=timedelta(milliseconds=10),
                non_retryable=(Declined,),
            )
        )
        async def a(ctx: StageContext[Num]) -> int:
            log.hit("a")
            if ctx.input.n == 1:
                raise NonRetryableError("no")
            raise Declined("card declined")

        for n, etype in ((1, "NonRetryableError"), (2, "Declined")):
            info, _ = await _run(harness, wf, {"n": n}, until="run.failed")
            assert info.status == RunStatus.FAILED
            assert info.error is not None and info.error.type == etype
        assert log.count("a") == 2

    async def test_bodies_that_exit_or_raise_a_base_exception_fail_their_attempt(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """A stage body that calls ``sys.exit()`` (async, or sync in the worker's thread pool)
        or raises a ``BaseException`` that is not an ``Exception`` fails its attempt under the
        stage's retry policy, and the worker goes on serving runs: natively ``SystemExit``
        stopped the worker's event loop, and a ``BaseException`` left the stage running until
        its lease expired, then again, for ever (Temporal failed the activity). A coroutine
        given to ``ctx.step.run`` instead of the function is a StepError, never retried."""
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("exit"), input=Num)
        twice = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=20))

        class Stop(BaseException):
            pass

        async def work() -> int:
            return 1

        @wf.stage(retry=twice)
        async def a(ctx: StageContext[Num]) -> int:
            log.hit(f"a{ctx.input.n}")
            if ctx.input.n == 1:
                raise SystemExit(3)
            if ctx.input.n == 2:
                raise Stop("stop")
            if ctx.input.n == 3:
                return int(await ctx.step.run("work", work()))  # type: ignore[arg-type]
            return 0

        @wf.stage(after=[a], retry=twice)
        def b(ctx: StageContext[Num]) -> int:
            log.hit(f"b{ctx.input.n}")
            if ctx.input.n == 4:
                raise SystemExit("done")
            return 0

        expected = {1: "StageExitError", 2: "Stop", 3: "StepError", 4: "StageExitError"}
        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            for n, etype in expected.items():
                run = await engine.start(wf.id, {"n": n})
                info = await engine.wait(run.id, timeout=60)
                assert info.status == RunStatus.FAILED, (n, info.status)
                assert info.error is not None and info.error.type == etype, info.error
                if n in (1, 4):
                    assert "sys.exit" in info.error.message
            run = await engine.start(wf.id, {"n": 0})
            assert (await engine.wait(run.id, timeout=60)).status == RunStatus.COMPLETED
        assert log.counts() == {"a0": 1, "a1": 2, "a2": 2, "a3": 1, "a4": 1, "b0": 1, "b4": 2}


class SleepContract:
    """S6: durable sleep; the step before it is replayed from the ledger."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s6_sleep(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s6"), input=Num)

        def x() -> int:
            log.hit("x")
            return 7

        @wf.stage
        async def s(ctx: StageContext[Num]) -> int:
            log.hit("s")
            v: int = await ctx.step.run("x", x)
            await ctx.step.sleep("nap", timedelta(milliseconds=300))
            return v

        t0 = time.monotonic()
        info, events = await _run(harness, wf, {})
        assert info.status == RunStatus.COMPLETED and info.output == 7
        assert time.monotonic() - t0 >= 0.3
        assert log.count("x") == 1 and log.count("s") == 2
        susp = next(e for e in events if e.type == "stage.suspended")
        done = next(e for e in events if e.type == "stage.completed")
        assert susp.data["reason"] == "sleep" and susp.data["until"]
        from datetime import datetime

        assert done.at >= datetime.fromisoformat(susp.data["until"]) - timedelta(milliseconds=5)
        trace = normalise(events, wf.graph())
        assert trace == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "s", 1],
            ["stage.suspended", "s", "sleep", "sleep:nap"],
            ["stage.completed", "s", 1],
            ["run.completed"],
        ]
        check_golden("s6_sleep", {"trace": trace, "counts": log.counts()})


class HookContract:
    """S15: hooks run registered handlers as durable steps."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s15_hooks(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s15"), input=Num, hooks=["order.charged"])

        @wf.stage
        async def a(ctx: StageContext[Num]) -> list[Any]:
            results = await ctx.hook("order.charged", {"n": ctx.input.n})
            await ctx.step.sleep("replay", timedelta(milliseconds=50))  # forces a replay
            return results

        registry = Registry([wf])

        async def notify(ctx: StageContext[Num], payload: dict[str, int]) -> str:
            log.hit("notify")
            return f"notified {payload['n']}"

        def audit(ctx: StageContext[Num], payload: dict[str, int]) -> int:
            log.hit("audit")
            return payload["n"] * 10

        registry.register_hook("order.charged", notify)
        registry.register_hook("order.charged", audit)
        info, _ = await _run(harness, wf, {"n": 4}, registry=registry)
        assert info.output == ["notified 4", 40]
        assert log.counts() == {"notify": 1, "audit": 1}

        bare = Workflow(unique_id("s15b"), input=Num, hooks=["order.charged"])

        @bare.stage
        async def b(ctx: StageContext[Num]) -> list[Any]:
            return await ctx.hook("order.charged", {})

        info, _ = await _run(harness, bare, {})
        assert info.output == []

    async def test_s15_events_staged_in_a_step_survive_a_later_suspension(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """Business events a hook handler, a step's function (sync or async) or a wait_for
        check stages are released when the run completes, also when the stage suspends
        after them: the replay returns the journaled results without running the functions,
        and the events they staged were lost (DESIGN §5, business events)."""
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s15e"), input=Num, hooks=["order.charged"])

        @wf.stage
        async def a(ctx: StageContext[Num]) -> str:
            ctx.emit("before", {"n": ctx.input.n})
            await ctx.hook("order.charged", {"n": ctx.input.n})

            def charge() -> str:
                log.hit("charge")
                ctx.emit("charged", {"sync": True})
                return "txn-1"

            async def receipt() -> str:
                ctx.emit("receipt", {"async": True})
                return "r-1"

            def ready() -> bool:
                ctx.emit("polled")
                return True

            txn: str = await ctx.step.run("charge", charge)
            await ctx.step.run("receipt", receipt)
            await ctx.step.wait_for("ready", ready)
            await ctx.step.sleep("settle", timedelta(milliseconds=50))  # forces a replay
            ctx.emit("after", {"txn": txn})
            return txn

        registry = Registry([wf])

        def notify(ctx: StageContext[Num], payload: dict[str, int]) -> str:
            log.hit("notify")
            ctx.emit("notified", payload)
            return "sent"

        registry.register_hook("order.charged", notify)
        info, events = await _run(harness, wf, {"n": 3}, registry=registry)
        assert info.status == RunStatus.COMPLETED, info.error
        business = [(e.type, e.data) for e in events if e.business]
        assert business == [
            ("before", {"n": 3}),
            ("notified", {"n": 3}),
            ("charged", {"sync": True}),
            ("receipt", {"async": True}),
            ("polled", {}),
            ("after", {"txn": "txn-1"}),
        ]
        assert log.counts() == {"notify": 1, "charge": 1}


class ClaimCheckContract:
    """S14: large values go through the blob store and round-trip unchanged."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s14_claim_check(self, harness: Harness, tmp_path: Path) -> None:
        if not harness.capabilities.claim_check:
            pytest.skip("driver lacks capability claim_check")
        log = ExecutionLog(tmp_path / "log")
        big_step = "s" * (1024 * 1024)
        wf = Workflow(unique_id("s14"), input=Num)

        def make() -> str:
            log.hit("make")
            return big_step

        @wf.stage
        async def big(ctx: StageContext[Num]) -> dict[str, str]:
            step = await ctx.step.run("make", make)
            await ctx.step.sleep("replay", timedelta(milliseconds=50))
            return {"blob": "b" * (10 * 1024 * 1024), "step": step[:10]}

        @wf.stage(after=[big])
        async def size(ctx: StageContext[Num]) -> int:
            return len(ctx.output_of(big)["blob"])

        info, events = await _run(harness, wf, {})
        assert info.status == RunStatus.COMPLETED
        assert info.output == 10 * 1024 * 1024
        assert info.stage("big").output["blob"] == "b" * (10 * 1024 * 1024)
        assert log.count("make") == 1
        assert all(len(str(e.data)) < 10_000 for e in events)

    async def test_s14_missing_blob(self, harness: Harness) -> None:
        if not harness.capabilities.claim_check:
            pytest.skip("driver lacks capability claim_check")
        from engine_port import MemoryBlobStore
        from engine_port.errors import SpilledPayloadUnavailableError

        wf = Workflow(unique_id("s14m"), input=Num)

        @wf.stage
        async def big(ctx: StageContext[Num]) -> str:
            return "z" * (200 * 1024)

        info, _ = await _run(harness, wf, {})
        assert info.status == RunStatus.COMPLETED
        async with harness.engine(
            Registry([wf]), MemorySink(), blob_store=MemoryBlobStore()
        ) as other:
            with pytest.raises(SpilledPayloadUnavailableError):
                await other.get_run(info.id)

    async def test_s14_a_stage_whose_spilled_input_vanished_fails_once(
        self, harness: Harness
    ) -> None:
        """A stage whose upstream output is missing from the blob store (deleted by hand, a
        store restarted without its data, a host pointed at another store) fails with
        ``SpilledPayloadUnavailableError``, once and for good: the data does not come back by
        itself (an unreachable store is a storage fault instead: the attempt is abandoned and
        retried). Before, both drivers took the stage again forever, failing in the engine."""
        if not harness.capabilities.claim_check:
            pytest.skip("driver lacks capability claim_check")
        from engine_port import MemoryBlobStore

        class Forgetful(MemoryBlobStore):
            """Says it wrote the blob, keeps nothing."""

            async def put(self, key: str, data: bytes) -> None:
                return None

        wf = Workflow(unique_id("s14v"), input=Num)

        @wf.stage
        async def big(ctx: StageContext[Num]) -> str:
            return "z" * (200 * 1024)

        undone: list[int] = []

        @big.compensation
        async def undo(ctx: StageContext[Num], output: str) -> None:
            undone.append(len(output))  # (never: its output is gone too)

        @wf.stage(
            after=[big], retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=10))
        )
        async def use(ctx: StageContext[Num]) -> int:
            return len(ctx.output_of(big))

        sink = MemorySink()
        async with (
            harness.engine(Registry([wf]), sink, blob_store=Forgetful()) as engine,
            engine.worker(),
        ):
            run = await engine.start(wf.id, {})
            events = await wait_for_events(sink, run.id, "run.failed")
        failed = [e for e in events if e.type == "stage.failed"]
        assert [(e.stage, e.data["attempt"]) for e in failed] == [("use", 1)]
        assert failed[0].data["error"]["type"] == "SpilledPayloadUnavailableError"
        assert failed[0].data["will_retry"] is False
        ended = next(e for e in events if e.type == "run.failed")
        assert ended.data["error"]["type"] == "SpilledPayloadUnavailableError"
        assert "blob_url" in ended.data["error"]["message"]
        # the compensation that needs the vanished output fails once, and the run ends
        assert undone == []
        assert not [e for e in events if e.type == "stage.compensated"]
