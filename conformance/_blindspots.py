"""Scenarios for what the rest of the contract could not fail on (found by the mutation check,
tests/mutation; see /work/shared/notes/conformance-blind-spots.md): the retry delay as
configured, the claim-check boundary, deterministic event ids, delivery order and no duplicate
deliveries, every suspension and business event with its own id, ``ctx.attempt`` after a
takeover, the step ledger kept by a redrive from the last failure, cancel between a failed
attempt and its retry, a failed step run again by the retry, the ``wait_for`` deadline, the
type of a stage timeout, a signal sent while its stage is running,
a run of a version no running worker serves left alone, a blob store that fails while an
attempt spills a value (DESIGN §5: abandoned like a crash, never a failed attempt)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine_port import (
    ErrorInfo,
    Event,
    Lifecycle,
    MemoryBlobStore,
    MemorySink,
    Registry,
    Retry,
    RunStatus,
    StageContext,
    Workflow,
)
from engine_port.errors import StepTimeoutError

from ._crash import kill_worker_when
from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._models import Num, says_its_version
from ._trace import normalise
from .apps.takeover import build as build_takeover

__all__ = ["ArrivalSink", "BlindSpotContract"]


class ArrivalSink(MemorySink):
    """A MemorySink that also keeps every delivery in arrival order (duplicates included)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[Event] = []

    async def publish(self, events: Sequence[Event]) -> None:
        await super().publish(events)
        self.arrivals.extend(events)


class FailingPuts(MemoryBlobStore):
    """A MemoryBlobStore that refuses its first ``fails`` writes of a value holding ``marker``,
    as an unreachable store would."""

    def __init__(self, marker: bytes, fails: int) -> None:
        super().__init__()
        self.marker, self.fails, self.refused = marker, fails, 0

    async def put(self, key: str, data: bytes) -> None:
        if self.marker in data and self.refused < self.fails:
            self.refused += 1
            raise OSError("blob store unreachable")
        await super().put(key, data)


class BlindSpotContract:
    """Assertions the other scenarios leave out, each killing a planted bug."""

    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_retry_waits_the_configured_delay(self, harness: Harness) -> None:
        """The first retry waits initial_interval (not initial*backoff, not nothing)."""
        starts: list[float] = []
        wf = Workflow(unique_id("bs-delay"), input=Num)

        @wf.stage(retry=Retry(max_attempts=2, initial_interval=timedelta(seconds=1.5), backoff=4))
        async def a(ctx: StageContext[Num]) -> int:
            starts.append(time.monotonic())
            if ctx.attempt == 1:
                raise RuntimeError("first attempt fails")
            return ctx.attempt

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == 2
        gap = starts[1] - starts[0]
        # 1.5 s as configured: no backoff at all would start it after the engine's own latency
        # (well under 1.5 s), an exponent off by one after 6 s; 3 s of slack for a busy machine
        assert 1.45 <= gap < 4.5, f"retry started {gap:.2f}s after the failed attempt"

    async def test_spill_threshold_is_inclusive(self, harness: Harness) -> None:
        """A step result of exactly spill_threshold_bytes stays inline; one byte more spills."""
        if not harness.capabilities.claim_check:
            pytest.skip("driver lacks capability claim_check")
        threshold = 1000
        wf = Workflow(unique_id("bs-spill"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            value = await ctx.step.run("blob", lambda: "x" * ctx.input.n)
            return len(value)

        store = MemoryBlobStore()
        keys: dict[int, int] = {}
        async with (
            harness.engine(
                Registry([wf]), MemorySink(), blob_store=store, spill_threshold_bytes=threshold
            ) as engine,
            engine.worker(),
        ):
            # a JSON string of n characters is n + 2 bytes
            for n in (10, threshold - 2, threshold - 1):
                run = await engine.start(wf.id, {"n": n})
                info = await engine.wait(run.id, timeout=60)
                assert info.status == RunStatus.COMPLETED and info.output == n
                keys[n] = len(await store.list(f"runs/{run.id}/"))
        assert keys[threshold - 2] == keys[10], f"a value of exactly the threshold spilled: {keys}"
        assert keys[threshold - 1] == keys[10] + 1, f"threshold + 1 byte did not spill: {keys}"

    async def test_event_ids_are_deterministic(self, harness: Harness) -> None:
        """Every lifecycle event id is the Lifecycle id of its position in the run's life."""
        wf = Workflow(unique_id("bs-ids"), input=Num)

        @wf.stage(retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)))
        async def a(ctx: StageContext[Num]) -> int:
            if ctx.attempt == 1:
                raise RuntimeError("first attempt fails")
            return 1

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED
        lc = Lifecycle(run.id)
        error = ErrorInfo(type="RuntimeError", message="first attempt fails", stage="a")
        expected = [
            lc.run_created(wf.graph().version).id,
            lc.run_started().id,
            lc.stage_started("a", 1).id,
            lc.stage_failed("a", 1, error, True).id,
            lc.stage_started("a", 2).id,
            lc.stage_completed("a", 2).id,
            lc.run_completed().id,
        ]
        assert [e.id for e in events] == expected

    async def test_delivery_in_order_without_duplicates(self, harness: Harness) -> None:
        """A healthy sink receives each run's events once each, in sequence order (a resumed
        stage must not emit its stage.started again: dedup in the trace would hide it), and
        every business event of a stage has an id of its own."""
        wf = Workflow(unique_id("bs-order"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            ctx.emit("a.first", {"n": 1})
            ctx.emit("a.second", {"n": 2})
            return 1

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> int:
            await ctx.step.sleep("nap", timedelta(milliseconds=100))
            await ctx.step.sleep("nap2", timedelta(milliseconds=100))
            ctx.emit("b.done", {"n": 2})
            return 2

        @wf.stage(after=[b])
        async def c(ctx: StageContext[Num]) -> int:
            ctx.emit("c.done", {"n": 3})
            return 3

        sink = ArrivalSink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED
        arrived = [e for e in sink.arrivals if e.run_id == run.id]
        ids = [e.id for e in arrived]
        assert len(ids) == len(set(ids)), [(e.type, e.seq) for e in arrived]
        seqs = [e.seq for e in arrived]
        assert seqs == sorted(seqs), f"delivered out of order: {seqs}"
        suspended = [e for e in sink.for_run(run.id) if e.type == "stage.suspended"]
        assert [e.data["waiting_for"] for e in suspended] == ["sleep:nap", "sleep:nap2"]
        business = [(e.type, e.data) for e in sink.for_run(run.id) if e.business]
        assert business == [
            ("a.first", {"n": 1}),
            ("a.second", {"n": 2}),
            ("b.done", {"n": 2}),
            ("c.done", {"n": 3}),
        ]

    async def test_attempt_kept_after_takeover(self, harness: Harness, tmp_path: Path) -> None:
        """A stage attempt taken over from a killed worker is still attempt 1 (no stage.failed,
        the body sees ctx.attempt == 1)."""
        if not harness.capabilities.crash_recovery:
            pytest.skip("driver lacks capability crash_recovery")
        log_path = tmp_path / "log"
        log = ExecutionLog(log_path)
        wid = unique_id("bs-takeover")
        registry = build_takeover(wid, str(log_path))
        sink = MemorySink()
        async with harness.engine(registry, sink) as engine:
            run = await engine.start(wid, {})
            await kill_worker_when(
                harness,
                "conformance.apps.takeover:registry",
                wid,
                log_path,
                lambda: len(log.entries()) == 1,
                "the worker to start stage b",
            )
            async with engine.worker():
                info = await engine.wait(run.id, timeout=90)
                events = await wait_for_events(sink, run.id, "run.completed", timeout=30)
        assert info.status == RunStatus.COMPLETED
        assert info.output == 1, f"the body saw attempt {info.output} after the takeover"
        assert log.entries() == ["b-attempt-1", "b-attempt-1"], log.entries()
        assert normalise(events, registry.get(wid).graph()) == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "b", 1],
            ["stage.completed", "b", 1],
            ["run.completed"],
        ]

    async def test_redrive_from_last_failure_keeps_steps(self, harness: Harness) -> None:
        """Redrive from the last failure keeps the failed stage's step ledger: a step that
        completed before the failure is not run again."""
        if not harness.capabilities.redrive:
            pytest.skip("driver lacks capability redrive")
        wf = Workflow(unique_id("bs-redrive"), input=Num)
        calls: list[str] = []

        def reserve() -> str:
            calls.append("reserve")
            return "reserved"

        @wf.stage(retry=Retry(max_attempts=1))
        async def a(ctx: StageContext[Num]) -> str:
            got: str = await ctx.step.run("reserve", reserve)
            calls.append("body")
            if calls.count("body") == 1:
                raise RuntimeError("fails once, after its step")
            return got

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            assert info.status == RunStatus.FAILED
            await engine.redrive(run.id, from_="last_failure")
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == "reserved"
        assert calls == ["reserve", "body", "body"], calls

    async def test_signal_while_stage_runs_is_buffered(self, harness: Harness) -> None:
        """A signal sent while the stage is running, before it reaches its wait, is buffered
        and consumed by that wait."""
        wf = Workflow(unique_id("bs-signal"), input=Num)
        entered = threading.Event()
        signalled = threading.Event()

        @wf.stage
        async def a(ctx: StageContext[Num]) -> Any:
            entered.set()
            await asyncio.to_thread(signalled.wait, 30)
            return await ctx.step.wait_for_signal("go")

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await eventually(entered.is_set, timeout=60, what="stage a to start")
            await engine.signal(run.id, "go", {"v": 1})
            signalled.set()
            info = await engine.wait(run.id, timeout=30)
        assert info.status == RunStatus.COMPLETED and info.output == {"v": 1}

    async def test_unserved_version_is_not_begun(self, harness: Harness) -> None:
        """A run pinned to a version no running worker serves is not begun by another
        version's worker: it stays pending, with no run.started."""
        if not harness.capabilities.pinned_versions:
            pytest.skip("driver lacks capability pinned_versions")
        wid = unique_id("bs-pinned")
        sink = MemorySink()
        async with (
            harness.engine(Registry([says_its_version(wid, "v1")]), sink) as e1,
            harness.engine(Registry([says_its_version(wid, "v2")]), sink) as e2,
        ):
            old = await e1.start(wid, {})
            async with e2.worker():
                new = await e2.start(wid, {})
                assert (await e2.wait(new.id, timeout=60)).output == "v2"
                await wait_for_events(sink, new.id, "run.completed")
                assert (await e2.get_run(old.id)).status == RunStatus.PENDING
            # run.created may wait for a worker (Temporal) but nothing else may happen
            assert {e.type for e in sink.for_run(old.id)} <= {"run.created"}

    async def test_cancel_during_retry_backoff(self, harness: Harness) -> None:
        """A run cancelled between a failed attempt and its retry: the stage ends cancelled,
        with stage.cancelled, and is not retried."""
        wf = Workflow(unique_id("bs-cancel"), input=Num)
        calls: list[int] = []

        @wf.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(seconds=30)))
        async def a(ctx: StageContext[Num]) -> int:
            calls.append(ctx.attempt)
            raise RuntimeError("fails, then waits 30 s before its retry")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            await wait_for_events(sink, run.id, "stage.failed")
            await engine.cancel(run.id)
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.cancelled")
        assert info.status == RunStatus.CANCELLED
        assert info.stage("a").status.value == "cancelled"
        assert calls == [1]
        assert normalise(events, wf.graph()) == [
            ["run.created"],
            ["run.started"],
            ["stage.started", "a", 1],
            ["stage.failed", "a", 1, "RuntimeError", True],
            ["stage.cancelled", "a"],
            ["run.cancelled"],
        ]

    async def test_failed_step_runs_again_on_retry(self, harness: Harness) -> None:
        """A step that raised is not journaled: the retry runs it again and gets its result."""
        wf = Workflow(unique_id("bs-step"), input=Num)
        calls: list[int] = []

        def charge() -> str:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("the payment service is down")
            return "charged"

        @wf.stage(retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50)))
        async def a(ctx: StageContext[Num]) -> str:
            result: str = await ctx.step.run("charge", charge)
            return result

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == "charged", info
        assert len(calls) == 2

    async def test_wait_for_ends_at_its_deadline(self, harness: Harness) -> None:
        """A poll interval longer than the deadline still ends at the deadline with
        StepTimeoutError."""
        wf = Workflow(unique_id("bs-waitfor"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> str:
            try:
                await ctx.step.wait_for("never", lambda: None, interval=120, timeout=0.5)
            except StepTimeoutError:
                return "timed out"
            return "met"

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == "timed out"

    async def test_stage_timeout_is_typed(self, harness: Harness) -> None:
        """An attempt over its stage timeout fails with StageTimeoutError."""
        if not harness.capabilities.stage_timeout:
            pytest.skip("driver lacks capability stage_timeout")
        wf = Workflow(unique_id("bs-timeout"), input=Num)

        @wf.stage(timeout=timedelta(milliseconds=300), retry=Retry(max_attempts=1))
        async def slow(ctx: StageContext[Num]) -> int:
            await asyncio.sleep(30)
            return 1

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == "StageTimeoutError", info.error
        failed = [e for e in events if e.type == "stage.failed"]
        assert [e.data["error"]["type"] for e in failed] == ["StageTimeoutError"]

    async def test_blob_store_fault_keeps_the_attempt(self, harness: Harness) -> None:
        """The blob store refuses twice to take a step's spilled result: each time the
        attempt is abandoned like a crash (DESIGN §5): no ``stage.failed``, no retry used up
        (the stage allows none), the attempt number kept, the step body run again because it
        was not journaled; then the run completes."""
        if not harness.capabilities.claim_check:
            pytest.skip("driver lacks capability claim_check")
        wf = Workflow(unique_id("bs-store-fault"), input=Num)
        attempts: list[int] = []

        @wf.stage(retry=Retry(max_attempts=1))
        async def a(ctx: StageContext[Num]) -> int:
            attempts.append(ctx.attempt)
            value = await ctx.step.run("big", lambda: "FAULTY" + "x" * 4000)
            return len(value)

        store = FailingPuts(b"FAULTY", fails=2)
        sink = MemorySink()
        async with (
            harness.engine(
                Registry([wf]), sink, blob_store=store, spill_threshold_bytes=1000
            ) as engine,
            engine.worker(),
        ):
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=90)
            events = await wait_for_events(sink, run.id, "run.completed")
        assert store.refused == 2
        assert info.status == RunStatus.COMPLETED and info.output == 4006, info.error
        assert info.stage("a").attempt == 1
        assert attempts == [1, 1, 1]
        assert [(e.type, e.stage) for e in events] == [
            ("run.created", None),
            ("run.started", None),
            ("stage.started", "a"),
            ("stage.completed", "a"),
            ("run.completed", None),
        ]
