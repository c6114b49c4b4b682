"""engine.purge(older_than=...) on Temporal: finished runs leave Temporal and the BlobStore;
active runs keep everything (issue 16)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from conformance import eventually
from driver_temporal import _purge
from engine_port import FolderBlobStore, MemorySink, Registry, StageContext, Workflow
from engine_port.errors import DriverUnavailableError, RunNotFoundError

from .conftest import EngineFactory, wait_for_event

pytestmark = pytest.mark.temporal


class In(BaseModel):
    pad: str = ""


async def test_purge_deletes_finished_runs_and_their_blobs(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    wf = Workflow("purge-me", input=In)

    @wf.stage
    async def big(ctx: StageContext[In]) -> str:
        return ctx.input.pad * 2  # spilled: over the threshold

    @wf.stage(after=[big])
    async def wait(ctx: StageContext[In]) -> str:
        if ctx.input.pad == "w":
            await ctx.step.wait_for_signal("go")
        return "ok"

    store = FolderBlobStore(blob_dir)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, spill_threshold_bytes=1024)
    async with engine, engine.worker():
        done = await engine.start(wf.id, {"pad": "x" * 4096})
        active = await engine.start(wf.id, {"pad": "w"})
        assert (await engine.wait(done.id, timeout=60)).status == "completed"
        await wait_for_event(sink, active.id, "stage.suspended", timeout=60)
        assert await store.list(f"runs/{done.id}/")
        # not old enough yet
        assert await engine.purge(older_than=timedelta(hours=1)) == 0
        assert (await engine.get_run(done.id)).status == "completed"
        # the listing purge reads is Temporal's visibility store, which catches up with a
        # run's end a moment after wait() returned
        purged: list[int] = []

        async def purge_now() -> bool:
            purged.append(await engine.purge(older_than=0))
            return sum(purged) > 0

        await eventually(purge_now, timeout=30, what="the finished run to be purged")
        assert sum(purged) == 1
        assert await store.list(f"runs/{done.id}/") == []
        # Temporal deletes an execution asynchronously (~30 s after its close on the dev
        # server): purge counted the run once it was gone
        with pytest.raises(RunNotFoundError):
            await engine.get_run(done.id)
        # the suspended run is untouched and still finishes
        await engine.signal(active.id, "go")
        assert (await engine.wait(active.id, timeout=60)).status == "completed"


async def test_the_worker_applies_the_retention_setting(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    wf = Workflow("retained", input=In)

    @wf.stage
    async def big(ctx: StageContext[In]) -> str:
        return ctx.input.pad * 2

    store = FolderBlobStore(blob_dir)
    engine = make_engine(Registry([wf]), spill_threshold_bytes=1024, retention=0.5)
    async with engine, engine.worker():
        run = await engine.start(wf.id, {"pad": "x" * 4096})
        assert (await engine.wait(run.id, timeout=60)).status == "completed"
        deadline = time.monotonic() + 30
        while await store.list(f"runs/{run.id}/"):  # the worker's retention purges it
            assert time.monotonic() < deadline, "the worker never applied retention"
            await asyncio.sleep(0.1)


async def test_purge_deletes_a_run_an_operator_terminated(
    make_engine: EngineFactory, blob_dir: Path
) -> None:
    """A terminated execution keeps ``WfeStatus="suspended"`` (it cannot update its own search
    attributes) but the run is failed: purge deletes it like any failed run (it was never
    purged before)."""
    wf = Workflow("purge-terminated", input=In)

    @wf.stage
    async def hold(ctx: StageContext[In]) -> str:
        await ctx.step.wait_for_signal("go")
        return "ok"

    store = FolderBlobStore(blob_dir)
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, spill_threshold_bytes=1024)
    async with engine:
        run = await engine.start(wf.id, {"pad": "x" * 4096})  # a spilled input
        async with engine.worker():
            await wait_for_event(sink, run.id, "stage.suspended", timeout=60)
        await engine._conn.get_workflow_handle(run.id).terminate(reason="ops ticket 7")
        assert (await engine.get_run(run.id)).status == "failed"
        assert await store.list(f"runs/{run.id}/")
        purged = 0
        deadline = time.monotonic() + 20  # visibility lags the terminate a little
        while purged == 0 and time.monotonic() < deadline:
            purged = await engine.purge(older_than=0)
            if not purged:
                await asyncio.sleep(0.2)
        assert purged == 1
        assert await store.list(f"runs/{run.id}/") == []


async def test_a_purge_temporal_does_not_carry_out_in_time_says_to_call_it_again(
    make_engine: EngineFactory, blob_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Purge counts a run only once Temporal has deleted it; when Temporal has not within
    ``CONFIRM_S`` (here: its deletions never reach it), purge raises DriverUnavailableError
    saying to call it again, and the next purge finishes the job."""
    wf = Workflow("purge-late", input=In)

    @wf.stage
    async def big(ctx: StageContext[In]) -> str:
        return ctx.input.pad * 2

    store = FolderBlobStore(blob_dir)
    engine = make_engine(Registry([wf]), spill_threshold_bytes=1024)
    async with engine:
        async with engine.worker():
            run = await engine.start(wf.id, {"pad": "x" * 4096})
            assert (await engine.wait(run.id, timeout=60)).status == "completed"

        async def lost(*_: object) -> None:
            return None  # the deletion never reaches Temporal

        monkeypatch.setattr(_purge, "CONFIRM_S", 0.5)
        monkeypatch.setattr(_purge, "_delete_execution", lost)
        raised: list[DriverUnavailableError] = []

        async def purge_late() -> bool:
            try:
                assert await engine.purge(older_than=0) == 0  # (not listed yet)
            except DriverUnavailableError as exc:
                raised.append(exc)
            return bool(raised)

        await eventually(purge_late, timeout=30, what="the purge to give up waiting")
        assert "1 of the 1 run(s)" in str(raised[0])
        assert "call purge again" in str(raised[0])
        assert await store.list(f"runs/{run.id}/") == []  # its data is gone already
        listed = await engine.list_runs(workflow_id=wf.id, outputs=False)
        assert [r.id for r in listed] == [run.id]  # (still in Temporal)
        monkeypatch.undo()
        assert await engine.purge(older_than=0) == 1
        with pytest.raises(RunNotFoundError):
            await engine.get_run(run.id)
        assert run.id not in {r.id for r in await engine.list_runs(workflow_id=wf.id)}
