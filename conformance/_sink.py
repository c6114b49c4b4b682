"""Scenario: a failing event sink and the flush result (issue 16: one model on every driver)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine_port import (
    Event,
    FlushResult,
    JsonlFileSink,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
)

from ._harness import Harness, eventually, unique_id, wait_for_events
from ._hooks import run_to
from ._models import Num

__all__ = ["EventSinkContract"]

# a refused event is retried at once and dead-lettered after its second refusal, so a run's
# events go through both states while the sink is down
SINK_SETTINGS: dict[str, Any] = {
    "dead_letter_after": 2,
    "outbox_dead_letter_min_seconds": 0.0,
    "outbox_retry_initial_seconds": 0.0,
    "outbox_retry_max_seconds": 0.0,
}


def _check(result: FlushResult) -> None:
    assert min(result.published, result.failed, result.dead_lettered) >= 0, result
    if result.failed or result.dead_lettered:
        assert result.sink_status == "degraded", result
        assert result.sink_error and "event sink unavailable" in result.sink_error, result
    if result.sink_status == "healthy":
        assert result.sink_error is None, result


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class _MisbehavingSink(MemorySink):
    """While ``failing``: raises the next of ``FAULTS`` (BaseExceptions a user's sink may
    raise); while ``hanging``: never returns (bounded by its own ``publish_timeout``)."""

    FAULTS: tuple[BaseException, ...] = (
        GeneratorExit(),
        asyncio.CancelledError("the sink's own"),
        SystemExit(3),
        _Unprintable(),
        ValueError("x" * 5_000_000),
    )

    def __init__(self) -> None:
        super().__init__()
        self.publish_timeout = 0.3
        self.hanging = False

    async def publish(self, events: Sequence[Event]) -> None:
        self.attempts += 1
        if self.hanging:
            await asyncio.Event().wait()
        if self.failing:
            raise self.FAULTS[self.attempts % len(self.FAULTS)]
        self.events.extend(events)


def _readable(result: FlushResult) -> None:
    assert min(result.published, result.failed, result.dead_lettered) >= 0, result
    if result.sink_error is not None:
        assert len(result.sink_error) < 1100 and "\n" not in result.sink_error, result


class EventSinkContract:
    async def test_s17_failing_sink_degrades_and_dead_letters_then_replays(
        self, harness: Harness
    ) -> None:
        wf = Workflow(unique_id("s17"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            return ctx.input.n + 1

        sink = MemorySink()
        sink.failing = True
        seen: list[FlushResult] = []
        async with harness.engine(Registry([wf]), sink, **SINK_SETTINGS) as engine:
            async with engine.worker():
                run = await engine.start(wf.id, {"n": 1})
                assert (await engine.wait(run.id, timeout=30)).status == "completed"

                async def refused() -> bool:
                    # the flush result says the sink is degraded, with the sink's error; a
                    # dead letter is never counted as failed too (checked per result)
                    result = await engine.flush_events()
                    _check(result)
                    seen.append(result)
                    if any(r.failed or r.dead_lettered for r in seen):
                        return True
                    # or the worker's own flush met the refusal first, and its retries
                    # dead-lettered the events (``dead_letter_after``): this one finds none
                    return any(e.run_id == run.id for e in await engine.dead_letters())

                await eventually(refused, timeout=30, what="a flush that reports the refusal")

                sink.failing = False
                assert sink.for_run(run.id) == []

                async def recovered() -> bool:
                    # refused events come back: retried ones by a flush, dead letters by replay
                    _check(await engine.flush_events())
                    await engine.replay_dlq()
                    return any(e.type == "run.completed" for e in sink.for_run(run.id))

                await eventually(recovered, timeout=30, what="delivery after the sink recovers")
                events = await wait_for_events(sink, run.id, "run.completed", timeout=30)
            assert [e.seq for e in events] == sorted({e.seq for e in events})
            final = await engine.flush_events()
            _check(final)
            assert final.sink_status == "healthy" and final.sink_error is None, (final, seen)

    async def test_jsonl_sink_survives_a_torn_line(self, harness: Harness, tmp_path: Path) -> None:
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

        info, events = await run_to(harness, Registry([wf]), wf, "run.completed", sink=sink)
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

    async def test_a_sink_raising_base_exceptions_is_a_refused_delivery(
        self, harness: Harness
    ) -> None:
        """SystemExit, GeneratorExit, the sink's own CancelledError, an unprintable or a 5 MB
        error: each a refused delivery with a short readable error; runs go on, and the
        events arrive once the sink recovers."""
        wf = Workflow(unique_id("sinkexc"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            return ctx.input.n + 1

        sink = _MisbehavingSink()
        sink.failing = True
        engine_ctx = harness.engine(Registry([wf]), sink, **SINK_SETTINGS)
        async with engine_ctx as engine, engine.worker():
            runs = [await engine.start(wf.id, {"n": i}) for i in range(3)]
            for run in runs:
                assert (await engine.wait(run.id, timeout=30)).status == "completed"

            async def refused() -> bool:
                # every fault raised (a refusal each: dead letters after the second)
                _readable(await engine.flush_events())
                return sink.attempts >= len(sink.FAULTS)

            await eventually(refused, timeout=30, what="the sink's refusals")
            later = await engine.start(wf.id, {"n": 9})  # the worker still runs stages
            assert (await engine.wait(later.id, timeout=30)).status == "completed"
            sink.failing = False

            async def recovered() -> bool:
                _readable(await engine.flush_events())
                await engine.replay_dlq()
                return all(
                    any(e.type == "run.completed" for e in sink.for_run(r.id))
                    for r in (*runs, later)
                )

            await eventually(recovered, timeout=30, what="delivery after the sink recovers")

    async def test_a_hanging_sink_holds_neither_runs_nor_the_stop(self, harness: Harness) -> None:
        """A publish that never returns is cut at the sink's ``publish_timeout``: a refused
        delivery (retried), while runs complete and the worker stops promptly."""
        wf = Workflow(unique_id("sinkhang"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            return ctx.input.n + 1

        @wf.stage(after=[a])
        async def b(ctx: StageContext[Num]) -> int:
            return ctx.input.n + 2

        sink = _MisbehavingSink()
        sink.hanging = True
        async with harness.engine(Registry([wf]), sink, **SINK_SETTINGS) as engine:
            async with engine.worker():
                began = time.monotonic()
                runs = [await engine.start(wf.id, {"n": i}) for i in range(3)]
                for run in runs:
                    assert (await engine.wait(run.id, timeout=30)).status == "completed"
                assert time.monotonic() - began < 15, "runs waited for the hanging sink"
                result = await asyncio.wait_for(engine.flush_events(), 15)
                _readable(result)
                tried_by = time.monotonic() + 15  # (the worker's flush may hold the events)
                while not sink.attempts:
                    assert time.monotonic() < tried_by, "the hanging sink was never called"
                    _readable(await asyncio.wait_for(engine.flush_events(), 15))
                    await asyncio.sleep(0.05)
                stopping = time.monotonic()
            assert time.monotonic() - stopping < 10, "the stop waited for the hanging sink"
            sink.hanging = False

            async def delivered() -> bool:
                _readable(await engine.flush_events())
                await engine.replay_dlq()
                return all(any(e.type == "run.completed" for e in sink.for_run(r.id)) for r in runs)

            await eventually(delivered, timeout=30, what="delivery once the sink answers")
