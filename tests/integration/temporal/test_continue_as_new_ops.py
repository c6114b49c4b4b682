"""The engine's operations on a run that continued as new (``GraphWorkflow._continue``) behave
as on the same run that never continued: cancel (while it waits on a signal or a sleep), a
failure and its redrive, export and migration into the native driver, purge (every execution
of the run's workflow id and its blob data), and the reads (get_run, steps, list_runs by
status) in between. Each case runs the same workflow twice, at a low ``continue_as_new_events``
and at the default (it never continues), and compares them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from conformance._trace import normalise
from driver_temporal import TemporalEngine
from driver_temporal._purge import run_blob_prefixes
from engine_port import (
    EngineSettings,
    FolderBlobStore,
    MemorySink,
    Registry,
    Retry,
    RunInfo,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)
from engine_port.errors import RunNotFoundError

from .conftest import EngineFactory
from .test_continue_as_new import Calls, In, check_reads, executions, until

pytestmark = pytest.mark.temporal

# history events before a run continues as new (the default: thousands): so few that the run
# continues at each of its waits, its last one included (an execution that continues within
# a second of its start has its first workflow task a second late: a few waits keep it short)
LOW = 12
SIGNALS = 3  # the signals stage b takes before its last wait


def ops_workflow(calls: Calls, *, last: str, broken: dict[str, bool]) -> Workflow[In]:
    """a (compensated on failure or cancel), then b: a journaled step, SIGNALS signals
    ``go``, then its ``last`` wait (the signal ``end``, or a long sleep), then it fails while
    ``broken["b"]``."""
    wf = Workflow(f"can-ops-{last}-{time.monotonic_ns()}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        calls.hit("a")
        return "A"

    @a.compensation
    async def undo_a(ctx: StageContext[In], out: str) -> None:
        calls.hit(f"undo-a:{out}")

    @wf.stage(after=[a], signals=["go", "end"], retry=Retry(max_attempts=1))
    async def b(ctx: StageContext[In]) -> int:
        await ctx.step.run("before", lambda: calls.hit("before"))
        total = 0
        for _ in range(SIGNALS):
            got = await ctx.step.wait_for_signal("go", timeout=600)
            total += int(got["v"])
        if last == "sleep":
            await ctx.step.sleep("nap", 600.0)
        else:
            total += int((await ctx.step.wait_for_signal("end", timeout=600))["v"])
        calls.hit("b")
        if broken["b"]:
            raise RuntimeError("b is broken")
        return total

    return wf


async def _suspensions(sink: MemorySink, run_id: str) -> int:
    return sum(1 for e in sink.for_run(run_id) if e.type == "stage.suspended")


async def _drive(engine: TemporalEngine, sink: MemorySink, run: RunInfo) -> None:
    """Send b's SIGNALS signals one at a time, each once b suspended for it (both runs take
    the same path), then wait for b's last wait."""
    for i in range(SIGNALS):

        async def suspended(k: int = i) -> bool:
            return await _suspensions(sink, run.id) >= k + 1

        await until(f"the wait for signal {i}", suspended)
        await engine.signal(run.id, "go", {"v": i}, idempotency_key=f"k{i}")

    async def last_wait() -> bool:
        return await _suspensions(sink, run.id) >= SIGNALS + 1

    await until("b's last wait", last_wait)


async def _continued_in_last_wait(engine: TemporalEngine, sink: MemorySink, run_id: str) -> None:
    """Wait until the run continued as new while it waits in b's last wait: it waits in
    the execution its state went on in, what every operation then acts on."""
    (last,) = [e for e in sink.for_run(run_id) if e.type == "stage.suspended"][-1:]

    async def went_on() -> bool:
        found = await executions(engine, run_id)
        return found[-1].start_time > last.at and len(found) > SIGNALS

    await until("a continue-as-new in b's last wait", went_on)


Scenario = Callable[[TemporalEngine, MemorySink, RunInfo, dict[str, bool]], Awaitable[None]]


async def _listed(engine: TemporalEngine, run_id: str, status: RunStatus) -> list[str]:
    return [r.id for r in await engine.list_runs(status=status, id_prefix=run_id)]


async def _listed_once(engine: TemporalEngine, run_id: str, status: RunStatus) -> None:
    """list_runs by status shows the run once under ``status`` (visibility catches up with
    the run a moment later) and under no other; a continued-from execution keeps the
    active WfeStatus it had, so it must not show the run again, nor under that status."""

    async def shown() -> bool:
        return await _listed(engine, run_id, status) == [run_id]

    await until(f"list_runs(status={status}) to show {run_id}", shown, timeout=20)
    for other in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED, RunStatus.FAILED):
        if other != status:
            assert await _listed(engine, run_id, other) == [], other
    assert [r.id for r in await engine.list_runs(id_prefix=run_id)] == [run_id]
    page, _ = await engine.list_runs_page(status=status, id_prefix=run_id)
    assert [r.id for r in page] == [run_id]


def _steps(steps: list[Any]) -> list[tuple[str, str, bool]]:
    return [(s.stage, s.name, s.completed) for s in steps]


async def _twice(
    make_engine: EngineFactory,
    last: str,
    then: Scenario,
    *,
    broken: bool = False,
    reads: bool = True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the workflow once at the default threshold (the reference) and once at LOW, each
    driven to b's last wait and then through ``then``; what each did."""
    out: list[dict[str, Any]] = []
    for limit in (None, LOW):
        calls = Calls()
        flags = {"b": broken}
        wf = ops_workflow(calls, last=last, broken=flags)
        sink = MemorySink()
        options = {} if limit is None else {"continue_as_new_events": limit}
        engine = make_engine(
            Registry([wf]), sink=sink, task_queue=f"ops-{time.monotonic_ns()}", options=options
        )
        async with engine:
            run = await engine.start(wf, {"n": 1})
            async with engine.worker():
                await _drive(engine, sink, run)
                if limit:
                    await _continued_in_last_wait(engine, sink, run.id)
                else:
                    assert len(await executions(engine, run.id)) == 1
                # the reads while it waits, after the continue-as-new
                waiting = await engine.get_run(run.id)
                assert waiting.status == RunStatus.SUSPENDED, waiting
                want = "signal:end" if last == "signal" else "sleep:nap"
                assert waiting.stage("b").waiting_for == want, waiting
                await _listed_once(engine, run.id, RunStatus.SUSPENDED)
                steps_waiting = _steps(await engine.steps(run.id))
                await then(engine, sink, run, flags)
                if reads:
                    await check_reads(engine, sink, wf, run)
            info = await engine.get_run(run.id)
            out.append(
                {
                    "trace": normalise(sink.for_run(run.id), wf.graph()),
                    "status": info.status,
                    "stages": [(s.id, s.status, s.attempt, s.waiting_for) for s in info.stages],
                    "output": info.output,
                    "calls": dict(calls.counts),
                    "steps": _steps(await engine.steps(run.id)),
                    "waiting": (
                        [(s.id, s.status, s.attempt, s.waiting_for) for s in waiting.stages],
                        steps_waiting,
                    ),
                    "executions": len(await executions(engine, run.id)),
                }
            )
    ref, got = out
    assert got.pop("executions") > ref.pop("executions")
    return ref, got


@pytest.mark.parametrize("last", ["signal", "sleep"])
async def test_cancel_after_continue_as_new(make_engine: EngineFactory, last: str) -> None:
    """engine.cancel of a run that continued as new, waiting on a signal or a sleep: it ends
    cancelled, compensated, with the events of the same run that never continued."""

    async def cancel(
        engine: TemporalEngine, sink: MemorySink, run: RunInfo, flags: dict[str, bool]
    ) -> None:
        cancelled = await engine.cancel(run.id)
        assert cancelled.status == RunStatus.CANCELLED, cancelled
        done = await engine.wait(run.id, timeout=60)
        assert done.status == RunStatus.CANCELLED, done
        await _listed_once(engine, run.id, RunStatus.CANCELLED)

    ref, got = await _twice(make_engine, last, cancel)
    assert got == ref
    assert ref["status"] == RunStatus.CANCELLED
    assert ref["calls"] == {"a": 1, "before": 1, "undo-a:A": 1}
    assert [e[0] for e in ref["trace"][-3:]] == [
        "stage.cancelled",
        "stage.compensated",
        "run.cancelled",
    ]


@pytest.mark.parametrize("how", ["stage", "terminate"])
async def test_redrive_after_continue_as_new(make_engine: EngineFactory, how: str) -> None:
    """A run that continued as new, then failed (its stage failed for good, compensated; or
    an operator terminated its execution), redriven from its last failure: b goes on from
    its whole ledger (no journaled step runs twice) and the run completes, with the events
    of the same run that never continued."""

    async def fail_then_redrive(
        engine: TemporalEngine, sink: MemorySink, run: RunInfo, flags: dict[str, bool]
    ) -> None:
        if how == "stage":
            await engine.signal(run.id, "end", {"v": 100})
        else:
            await engine._conn.get_workflow_handle(run.id).terminate(reason="by an operator")
        failed = await engine.wait(run.id, timeout=60)
        assert failed.status == RunStatus.FAILED, failed
        if how == "stage":
            assert failed.error is not None and "b is broken" in failed.error.message
            assert [(s.id, s.status) for s in failed.stages] == [
                ("a", "compensated"),
                ("b", "failed"),
            ]
        await _listed_once(engine, run.id, RunStatus.FAILED)
        flags["b"] = False
        again = await engine.redrive(run.id)
        assert again.id == run.id and again.redrive_count == 1, again
        if how == "terminate":
            # b waits for "end" again (its ledger kept the rest), in the redriven execution

            async def waits() -> bool:
                return (await engine.get_run(run.id)).stage("b").waiting_for == "signal:end"

            await until("b's wait after the redrive", waits)
            await engine.signal(run.id, "end", {"v": 100})
        done = await engine.wait(run.id, timeout=60)
        assert done.status == RunStatus.COMPLETED, done
        assert done.output == sum(range(SIGNALS)) + 100
        await _listed_once(engine, run.id, RunStatus.COMPLETED)

    ref, got = await _twice(make_engine, "signal", fail_then_redrive, broken=how == "stage")
    assert got == ref
    if how == "stage":
        assert ref["calls"] == {"a": 1, "before": 1, "b": 2, "undo-a:A": 1}
    else:
        assert ref["calls"] == {"a": 1, "before": 1, "b": 1}
    types = [e[0] for e in ref["trace"]]
    assert types.count("run.redriven") == 1 and types[-1] == "run.completed"


def _native(engine: TemporalEngine, db: Path, blob_dir: Path, sink: MemorySink) -> Any:
    return create_engine(
        EngineSettings(
            driver="native",
            database_url=f"sqlite:///{db}",
            blob_url=f"file://{blob_dir}",
            lease_seconds=1.0,
        ),
        engine.registry,
        event_sink=sink,
    )


def _snapshot_shape(snap: Any) -> dict[str, Any]:
    """What an export holds, without its times (each run has its own)."""
    data = snap.model_dump(mode="json")
    stages = [
        (
            st["id"],
            st["status"],
            st["attempt"],
            st["suspensions"],
            st["waiting_for"],
            st["output"],
            [(s["name"], s["kind"], s["completed"], s["result"], s["signal"]) for s in st["steps"]],
            len(st["staged_events"]),
        )
        for st in data["stages"]
    ]
    keep = ("status", "input", "current_group", "completed_count", "event_seq", "redrive_count")
    return {
        **{k: data[k] for k in keep},
        "stages": stages,
        "signals": data["signals"],
        "signal_keys": data["signal_keys"],
    }


async def test_migration_after_continue_as_new(
    make_engine: EngineFactory, tmp_path: Path, blob_dir: Path
) -> None:
    """export_run of a run that continued as new holds the whole run (every stage's whole
    ledger, the signal keys, the next event number), as the same run's that never
    continued; imported into the native driver it completes there, and the source's
    events (from seq 1, every execution) and the target's make up the run's events."""
    shapes: list[dict[str, Any]] = []

    async def migrate(
        engine: TemporalEngine, sink: MemorySink, run: RunInfo, flags: dict[str, bool]
    ) -> None:
        snapshot = await engine.export_run(run.id, wait=10)
        shapes.append(_snapshot_shape(snapshot))
        db = tmp_path / f"wfe-{len(shapes)}.db"
        async with _native(engine, db, blob_dir, sink) as target:
            await target.import_run(snapshot)
            moved = await engine.complete_export(run.id, target.driver_name)
            assert moved.status == RunStatus.MIGRATED, moved
            async with target.worker():
                await target.signal(run.id, "end", {"v": 100})
                done = await target.wait(run.id, timeout=60)
            assert done.status == RunStatus.COMPLETED, done
            assert done.output == sum(range(SIGNALS)) + 100
            # the whole run: the source's events (all its executions) then the target's
            mine, theirs = await engine.events(run.id), await target.events(run.id)
            assert [e.seq for e in mine + theirs] == list(range(1, len(mine) + len(theirs) + 1))
            assert mine[0].type == "run.created" and mine[-1].type == "run.migrated"
            delivered = sorted(
                {e.id: e for e in sink.for_run(run.id)}.values(), key=lambda e: e.seq
            )
            assert [e.id for e in mine + theirs] == [e.id for e in delivered]

    ref, got = await _twice(make_engine, "signal", migrate, reads=False)
    assert shapes[1] == shapes[0]
    (b,) = [st for st in shapes[0]["stages"] if st[0] == "b"]
    names = ["before", "go", *(f"go#{i}" for i in range(2, SIGNALS + 1)), "end"]
    assert [s[0] for s in b[6]] == names, b
    assert shapes[0]["signal_keys"] == sorted(f"k{i}" for i in range(SIGNALS))
    # the source reads the run as migrated; the target ran the rest of it
    assert got["status"] == ref["status"] == RunStatus.MIGRATED
    assert got == ref
    assert ref["calls"] == {"a": 1, "before": 1, "b": 1}


async def test_purge_after_continue_as_new(make_engine: EngineFactory, blob_dir: Path) -> None:
    """purge of a finished run that continued as new deletes every execution of its workflow
    id (those it continued from too) and its blob data: the run is gone."""
    calls = Calls()
    wf = ops_workflow(calls, last="signal", broken={"b": False})
    sink = MemorySink()
    store = FolderBlobStore(blob_dir)
    engine = make_engine(
        Registry([wf]), sink=sink, spill_threshold_bytes=64, options={"continue_as_new_events": LOW}
    )
    async with engine:
        run = await engine.start(wf, {"n": 1})
        async with engine.worker():
            await _drive(engine, sink, run)
            await engine.signal(run.id, "end", {"v": 1000})
            done = await engine.wait(run.id, timeout=60)
        assert done.status == RunStatus.COMPLETED and done.output == sum(range(SIGNALS)) + 1000
        ids = [ex.run_id for ex in await executions(engine, run.id)]
        assert len(ids) > 1
        assert await store.list(f"runs/{run.id}/")
        purged: list[int] = []

        async def purge_now() -> bool:
            purged.append(await engine.purge(older_than=0))
            return sum(purged) > 0

        await until("the finished run to be purged", purge_now, timeout=60)
        assert sum(purged) == 1
        assert await executions(engine, run.id) == []
        for execution_id in ids:
            handle = engine._conn.get_workflow_handle(run.id, run_id=execution_id)
            with pytest.raises(RPCError) as err:
                await handle.describe()
            assert err.value.status == RPCStatusCode.NOT_FOUND, execution_id
        with pytest.raises(RunNotFoundError):
            await engine.get_run(run.id)
        assert await engine.list_runs(id_prefix=run.id) == []
        for prefix in run_blob_prefixes(run.id):
            assert await store.list(prefix) == [], prefix


async def test_listed_once_through_its_continues(make_engine: EngineFactory) -> None:
    """list_runs shows a run that continues as new once at every moment, its continues
    included: never twice (the execution it continued from and the new one), never not at
    all (the one it continued from closed, the new one not listed yet)."""
    calls = Calls()
    wf = ops_workflow(calls, last="signal", broken={"b": False})
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": LOW})
    seen: list[list[str]] = []
    async with engine:
        run = await engine.start(wf, {"n": 1})

        async def listed() -> bool:
            return [r.id for r in await engine.list_runs(id_prefix=run.id)] == [run.id]

        await until("the run to be listed", listed)
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                seen.append([r.id for r in await engine.list_runs(id_prefix=run.id)])
                page, _ = await engine.list_runs_page(id_prefix=run.id)
                seen.append([r.id for r in page])
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            async with engine.worker():
                await _drive(engine, sink, run)
                await _continued_in_last_wait(engine, sink, run.id)
                await engine.signal(run.id, "end", {"v": 1})
                done = await engine.wait(run.id, timeout=60)
        finally:
            stop.set()
            await watcher
    assert done.status == RunStatus.COMPLETED
    assert len(seen) > 20
    wrong = [(i, ids) for i, ids in enumerate(seen) if ids != [run.id]]
    assert not wrong, (len(seen), wrong)


async def test_pages_show_runs_that_continued_once(make_engine: EngineFactory) -> None:
    """list_runs_page, a run a page: two runs that just continued as new (several times) are
    each shown once, however the executions they continued from fall on later pages."""
    calls = Calls()
    wf = ops_workflow(calls, last="signal", broken={"b": False})
    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink, options={"continue_as_new_events": LOW})
    async with engine:
        runs = [await engine.start(wf, {"n": 1}) for _ in range(2)]
        async with engine.worker():
            for run in runs:
                await _drive(engine, sink, run)
                await _continued_in_last_wait(engine, sink, run.id)
            want = sorted(r.id for r in runs)

            async def paged(status: RunStatus | None) -> list[str]:
                ids: list[str] = []
                cursor: str | None = None
                while True:
                    page, cursor = await engine.list_runs_page(
                        workflow_id=wf.id, status=status, limit=1, after=cursor
                    )
                    ids += [r.id for r in page]
                    if cursor is None:
                        return ids

            async def both_listed() -> bool:
                return sorted(await paged(RunStatus.SUSPENDED)) == want

            await until("both runs listed as suspended", both_listed, timeout=20)
            for status in (RunStatus.SUSPENDED, None):
                assert sorted(await paged(status)) == want, status
            listed = await engine.list_runs(workflow_id=wf.id, status=RunStatus.SUSPENDED)
            assert sorted(r.id for r in listed) == want
