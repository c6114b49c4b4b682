"""A native import of a stage whose attempt is exported ``running`` at an uncompleted signal
wait: imported suspended in that wait only when the snapshot shows that the attempt suspended
there already (its ``stage.suspended`` emitted at the source), so that the target neither
emits that suspension a second time nor swallows one the source never emitted.

The snapshots are a native export's, edited into the states other sources produce (the
Temporal paths are in ``test_migration_probe_2``): a lost worker's try that journaled the
wait before its suspension was recorded (``suspensions`` 0), and an attempt that suspended
in a sleep before its lost try journaled the wait."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    Event,
    MemorySink,
    Registry,
    RunSnapshot,
    RunStatus,
    StageContext,
    StageStatus,
    Workflow,
    WorkflowEngine,
    create_engine,
)
from engine_port.driver import SnapshotWait


class Doc(BaseModel):
    nap: bool = False


def _workflow() -> Workflow[Doc]:
    """b naps first (if asked), then waits for ``go``."""
    wf = Workflow(f"mig-at-wait-{uuid.uuid4().hex[:8]}", input=Doc, version="v1")

    @wf.stage
    async def b(ctx: StageContext[Doc]) -> Any:
        if ctx.input.nap:
            await ctx.step.sleep("nap", 0.05)
        return await ctx.step.wait_for_signal("go")

    return wf


@asynccontextmanager
async def _two(tmp_path: Path, wf: Workflow[Doc]) -> AsyncIterator[list[tuple[Any, MemorySink]]]:
    sides = []
    for name in ("src", "dst"):
        sink = MemorySink()
        settings = EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / f'{name}.db'}",
            blob_url=f"file://{tmp_path / 'blobs'}",
        )
        sides.append((create_engine(settings, Registry([wf]), event_sink=sink), sink))
    async with sides[0][0], sides[1][0]:
        yield sides


async def _until(what: str, probe: Callable[[], Awaitable[bool]]) -> None:
    deadline = time.monotonic() + 30
    while not await probe():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _delivered(engine: WorkflowEngine, sink: MemorySink, run_id: str) -> list[Event]:
    """The run's events in ``sink`` once every event ``engine`` holds for it got there."""
    held = {e.id for e in await engine.events(run_id)}

    async def all_there() -> bool:
        await engine.flush_events()
        return held <= {e.id for e in sink.for_run(run_id)}

    await _until("events delivered", all_there)
    return sink.for_run(run_id)


def _running_at_the_wait(snap: RunSnapshot, suspensions: int, told: bool) -> RunSnapshot:
    """``snap`` (b suspended in its wait for ``go``) with b's attempt ``running`` at that wait
    after ``suspensions`` suspensions (a withdrawn or lost try: no ``waiting_for``).

    ``told``: the snapshot says where the attempt last suspended (``suspended_in``), as the
    story goes: in the wait (1 suspension, no nap), nowhere (none), in the nap (1
    suspension after a nap); else it does not say (a snapshot from before it did), and the
    import reads the journal."""
    (st,) = snap.stages
    assert st.status == StageStatus.SUSPENDED and st.waiting_for == "signal:go", st
    assert st.suspended_in is not None and st.suspended_in.step == "go", st.suspended_in
    suspended_in = None
    if told and suspensions:
        (nap,) = [s for s in st.steps if s.name == "nap"] or [None]
        suspended_in = (
            st.suspended_in
            if nap is None
            else SnapshotWait(step="nap", until=nap.deadline, waiting_for="sleep:nap")
        )
    running = st.model_copy(
        update={
            "status": StageStatus.RUNNING,
            "suspensions": suspensions,
            "waiting_for": None,
            "wake_at": None,
            "suspended_in": suspended_in,
        }
    )
    return snap.model_copy(update={"stages": [running]})


@pytest.mark.parametrize("told", [True, False], ids=["suspended-in", "older-snapshot"])
@pytest.mark.parametrize(
    "nap,suspensions,again",
    [
        # suspended in the wait (a freeze withdrew the attempt a signal had resumed): it
        # waits there on the target, and its suspension is not sent a second time
        (False, 1, False),
        # never suspended in it (a lost worker's try journaled the wait): the target sends it
        (False, 0, True),
        # suspended in the nap, then a lost try journaled the wait: the target sends it
        (True, 1, True),
    ],
)
async def test_a_stage_imported_running_at_a_wait_suspends_there_once(
    tmp_path: Path, nap: bool, suspensions: int, again: bool, told: bool
) -> None:
    wf = _workflow()
    async with _two(tmp_path, wf) as [(src, src_sink), (dst, dst_sink)]:
        run = await src.start(wf.id, {"nap": nap})
        async with src.worker():

            async def parked() -> bool:
                info = await src.get_run(run.id)
                return info.status == RunStatus.SUSPENDED and info.stage("b").waiting_for == (
                    "signal:go"
                )

            await _until("b waits for go", parked)
        snap = await src.export_run(run.id)
        await dst.import_run(_running_at_the_wait(snap, suspensions, told))
        await src.complete_export(run.id, "native")
        await _delivered(src, src_sink, run.id)
        imported = (await dst.get_run(run.id)).stage("b")
        async with dst.worker():

            async def waits() -> bool:
                return (await dst.get_run(run.id)).status == RunStatus.SUSPENDED

            await _until("b waits for go on the target", waits)
            await dst.signal(run.id, "go", {"w": 1})
            info = await dst.wait(run.id, timeout=30)
        events = await _delivered(dst, dst_sink, run.id)
        at_source = {e.id: e.seq for e in src_sink.for_run(run.id)}
    assert info.status == RunStatus.COMPLETED and info.output == {"w": 1}, info
    sent = [e for e in events if e.type == "stage.suspended"]
    assert len(sent) == int(again), [(e.seq, e.type, e.data) for e in events]
    if not again:  # (else the edited snapshot hides the suspension the source did send)
        assert not [e for e in events if e.id in at_source], (at_source, events)
    assert [e.type for e in events][-2:] == ["stage.completed", "run.completed"]
    assert [e.seq for e in events] == list(range(snap.event_seq + 1, events[-1].seq + 1))
    if again:
        assert imported.status == StageStatus.RUNNING, imported
    else:
        assert (imported.status, imported.waiting_for) == (StageStatus.SUSPENDED, "signal:go")
