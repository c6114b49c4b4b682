"""Scenarios: moving live runs between two engines at every kind of safe point (issue 7).

A driver pair opts in with a ``migration_pair`` fixture returning (source, target) harnesses;
the contract runs it in both directions when the fixture is parametrized that way."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine_port import (
    MemorySink,
    NonRetryableError,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    migrate_run,
    migrate_runs,
)
from engine_port.errors import (
    InvalidInputError,
    MigrationError,
    RunNotActiveError,
    RunNotFoundError,
)

from ._harness import CONTRACT_MARKS, ExecutionLog, Harness, eventually, unique_id, wait_for_events
from ._models import Num
from ._trace import check_golden, normalise

__all__ = ["MigrationContract"]


def _workflow(log: ExecutionLog, kind: str) -> Workflow[Num]:
    wf = Workflow(unique_id(f"mig-{kind}"), input=Num, version="m1")

    @wf.stage
    async def a(ctx: StageContext[Num]) -> str:
        log.hit("a")
        ctx.emit("a.done", {"n": ctx.input.n})
        return "a"

    # ("gate": b starts on the signal go, its step and wait run once it is there; "gate-60s":
    # the same with a deadline that moves with the run)
    gated = kind.startswith("gate")
    timeout = timedelta(seconds=60) if kind == "gate-60s" else None

    @wf.stage(after=[a], after_signal="go" if gated else None, after_signal_timeout=timeout)
    async def b(ctx: StageContext[Num]) -> Any:
        log.hit("b")

        def x() -> str:
            log.hit("x")
            ctx.emit("x.done")  # journaled with the step: it must survive the move
            return "x"

        await ctx.step.run("x", x)
        if kind == "sleep":
            await ctx.step.sleep("nap", timedelta(milliseconds=1500))
            return "slept"
        if kind == "signal" or gated:
            return await ctx.step.wait_for_signal("go")
        if kind == "queue":  # several signals of one name queue while b waits for "hold"
            first = await ctx.step.wait_for_signal("first")
            await ctx.step.wait_for_signal("hold")
            return [first] + [await ctx.step.wait_for_signal("go") for _ in range(4)]
        return "b"

    @wf.stage(after=[a])
    async def c(ctx: StageContext[Num]) -> str:
        log.hit("c")
        return "c"

    @wf.stage(after=[b, c])
    async def d(ctx: StageContext[Num]) -> list[Any]:
        log.hit("d")
        if kind == "redrive":  # fails until redriven, then waits for a signal
            if log.count("d") == 1:
                raise NonRetryableError("d fails until the run is redriven")
            return [ctx.output_of(b), await ctx.step.wait_for_signal("go")]
        return [ctx.output_of(b), ctx.output_of(c)]

    return wf


@contextlib.asynccontextmanager
async def _pair(
    pair: tuple[Harness, Harness], registry: Registry, sink: MemorySink
) -> AsyncIterator[tuple[WorkflowEngine, WorkflowEngine]]:
    source, target = pair
    async with source.engine(registry, sink) as s, target.engine(registry, sink) as t:
        yield s, t


async def _moved(source: WorkflowEngine, target: WorkflowEngine, run_id: str) -> None:
    move = await migrate_run(source, target, run_id, wait=30)
    assert move.outcome == "moved", move
    again = await migrate_run(source, target, run_id, wait=30)  # a rerun never duplicates
    assert again.outcome == "skipped", again
    left = await source.get_run(run_id)
    assert left.status == RunStatus.MIGRATED and left.migrated_to == target.driver_name
    # the source says where the run went (it said only "another driver")
    with pytest.raises(RunNotActiveError, match=f"it moved to {target.driver_name} "):
        await source.cancel(run_id)
    await source.flush_events()


def _assert_migrated_once(events: list[Any]) -> None:
    assert [e.type for e in events].count("run.migrated") == 1


EXPECTED = [
    ["run.created"], ["run.started"],
    ["stage.started", "a", 1], ["stage.completed", "a", 1],
    ["stage.started", "b", 1], ["stage.completed", "b", 1],
    ["stage.started", "c", 1], ["stage.completed", "c", 1],
    ["stage.started", "d", 1], ["stage.completed", "d", 1],
    ["business", "a.done", "a", {"n": 1}],
    ["business", "x.done", "b", {}],
    ["run.completed"],
]  # fmt: skip


class MigrationContract:
    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_move_pending_run(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "plain")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            run = await source.start(wf.id, {"n": 1}, idempotency_key=unique_id("k"))
            await _moved(source, target, run.id)
            same = await target.start(wf.id, {"n": 1}, idempotency_key=run.idempotency_key)
            assert same.id == run.id  # the idempotency key followed the run
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
                events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED and info.output == ["b", "c"]
        assert log.counts() == {"a": 1, "b": 1, "c": 1, "d": 1, "x": 1}
        _assert_migrated_once(events)
        trace = normalise(events, wf.graph())
        assert trace == EXPECTED
        check_golden("mig_pending", {"trace": trace})

    async def test_import_takes_a_snapshot_as_json_and_refuses_anything_else(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """``import_run`` of something that is not a snapshot raised an AttributeError from
        inside the driver; a snapshot's JSON form (written to a file and read back between
        the two engines) is as good as the object."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "plain")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            bad: list[Any] = [None, "a snapshot", {}, {"run_id": 5}]
            for value in bad:
                with pytest.raises(InvalidInputError):
                    await target.import_run(value)
            run = await source.start(wf.id, {"n": 1})
            snapshot = await source.export_run(run.id, wait=30)
            moved = await target.import_run(snapshot.model_dump(mode="json"))
            assert moved.id == run.id
            await source.complete_export(run.id, target.driver_name)
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == ["b", "c"]
        assert log.counts() == {"a": 1, "b": 1, "c": 1, "d": 1, "x": 1}

    async def test_move_during_sleep(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "sleep")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            async with source.worker():
                run = await source.start(wf.id, {"n": 1})
                suspended = await wait_for_events(sink, run.id, "stage.suspended")
                until = next(e for e in suspended if e.type == "stage.suspended").data["until"]
                await eventually(lambda: log.count("c") == 1)
                await _moved(source, target, run.id)
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
                events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED and info.output == ["slept", "c"]
        assert log.counts() == {"a": 1, "b": 2, "c": 1, "d": 1, "x": 1}
        from datetime import datetime

        done_b = next(e for e in events if e.type == "stage.completed" and e.stage == "b")
        assert done_b.at >= datetime.fromisoformat(until) - timedelta(milliseconds=5)
        _assert_migrated_once(events)
        trace = normalise(events, wf.graph())
        assert trace[:5] + trace[6:] == EXPECTED
        assert trace[5] == ["stage.suspended", "b", "sleep", "sleep:nap"]

    @pytest.mark.parametrize(
        "kind", ["signal", "gate", "gate-60s"], ids=["in-body", "after_signal", "timed-gate"]
    )
    @pytest.mark.parametrize("signal_first", [False, True], ids=["signal-after", "signal-before"])
    async def test_move_while_waiting_for_signal(
        self,
        migration_pair: tuple[Harness, Harness],
        tmp_path: Path,
        signal_first: bool,
        kind: str,
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, kind)
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            async with source.worker():
                run = await source.start(wf.id, {"n": 1})
                await wait_for_events(sink, run.id, "stage.suspended")
                await eventually(lambda: log.count("c") == 1)
            if signal_first:
                # sent once the source's worker has stopped: a local worker would take the
                # woken stage in the signal's own transaction and finish the run at the source
                sent = await source.signal(run.id, "go", {"moved": True})
                assert sent.delivered
            wake_at = (await source.get_run(run.id)).stage("b").wake_at
            await _moved(source, target, run.id)
            if not signal_first:
                # (the deadline of a timed gate moved with the run)
                assert (await target.get_run(run.id)).stage("b").wake_at == wake_at
                assert (await target.signal(run.id, "go", {"moved": True})).delivered
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
                events = await wait_for_events(sink, run.id, "run.completed")
        assert info.status == RunStatus.COMPLETED
        assert info.output == [{"moved": True}, "c"]
        counts = log.counts()
        assert (counts["a"], counts["c"], counts["d"], counts["x"]) == (1, 1, 1, 1)
        if kind.startswith("gate"):
            assert counts["b"] == 1  # (no attempt before the signal, on either side)
        _assert_migrated_once(events)
        trace = normalise(events, wf.graph())
        assert [t for t in trace if t[0] != "stage.suspended"] == EXPECTED

    async def test_move_with_queued_signals(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """Three signals of one name buffered at the source move in arrival order, behind no
        later one; the idempotency keys seen (of a consumed signal and of a buffered one) move
        too, so a repeat at the target is not queued again."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "queue")
        sink = MemorySink()

        def waiting_for(run_id: str, what: str) -> Any:
            return lambda: [
                e
                for e in sink.for_run(run_id)
                if e.type == "stage.suspended" and e.data["waiting_for"] == what
            ]

        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            async with source.worker():
                run = await source.start(wf.id, {"n": 1})
                await eventually(waiting_for(run.id, "signal:first"))
                sent = await source.signal(run.id, "first", {"f": 1}, idempotency_key="kf")
                assert sent.delivered
                await eventually(waiting_for(run.id, "signal:hold"))
                results = [
                    await source.signal(run.id, "go", {"i": 1}, idempotency_key="k1"),
                    await source.signal(run.id, "go", {"i": 2}),
                    await source.signal(run.id, "go", {"i": 3}),
                ]
                assert [r.delivered for r in results] == [False] * 3
                await eventually(lambda: log.count("c") == 1)
            await _moved(source, target, run.id)
            snap = await target.export_run(run.id, wait=30)
            await target.abort_export(run.id)
            assert [(s.name, s.payload, s.idempotency_key) for s in snap.signals] == [
                ("go", {"i": 1}, "k1"),
                ("go", {"i": 2}, None),
                ("go", {"i": 3}, None),
            ]
            assert sorted(snap.signal_keys) == ["k1", "kf"]
            for name, key in (("first", "kf"), ("go", "k1")):
                again = await target.signal(run.id, name, {"again": True}, idempotency_key=key)
                assert (again.delivered, again.already_completed) == (False, True)
            assert not (await target.signal(run.id, "go", {"i": 4})).delivered
            assert (await target.signal(run.id, "hold", None)).delivered
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED
        assert info.output == [[{"f": 1}, {"i": 1}, {"i": 2}, {"i": 3}, {"i": 4}], "c"]
        assert (log.count("a"), log.count("c"), log.count("d"), log.count("x")) == (1, 1, 1, 1)

    async def test_move_between_stages_of_a_group(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """b waits for a signal while c (same group) has completed: only b is left."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "signal")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            async with source.worker():
                run = await source.start(wf.id, {"n": 1})
                await eventually(lambda: log.count("c") == 1 and log.count("b") == 1)
                await wait_for_events(sink, run.id, "stage.suspended")
                before = await source.get_run(run.id)
                assert before.stage("c").status == "completed"
            t0 = time.monotonic()
            await _moved(source, target, run.id)
            assert time.monotonic() - t0 < 30
            moved = await target.get_run(run.id)
            assert moved.stage("c").status == "completed" and moved.stage("c").output == "c"
            await target.signal(run.id, "go", 7)
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
        assert info.output == [7, "c"]
        assert log.counts()["c"] == 1 and log.counts()["a"] == 1

    async def test_move_a_redriven_run(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """The redrive count and the archived attempts (redrive history) follow the run."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "redrive")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            async with source.worker():
                run = await source.start(wf.id, {"n": 1})
                failed = await source.wait(run.id, timeout=60)
                assert failed.status == RunStatus.FAILED
                await source.redrive(run.id, from_="last_failure")
                await wait_for_events(sink, run.id, "stage.suspended")
            await _moved(source, target, run.id)
            moved = await target.get_run(run.id)
            assert moved.redrive_count == 1 and moved.stage("d").status == "suspended"
            snap = await target.export_run(run.id, wait=30)
            await target.abort_export(run.id)
            assert snap.redrive_count == 1
            assert [h["stage"] for h in snap.redrive_history] == ["d"]
            assert (await target.signal(run.id, "go", "again")).delivered
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == ["b", "again"]
        assert info.redrive_count == 1
        # d: the failed attempt, the redriven one up to its wait, its replay after the signal
        assert log.counts() == {"a": 1, "b": 1, "c": 1, "d": 3, "x": 1}

    async def test_a_run_moved_back_runs_again_where_it_started(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """Source -> target -> source: the run is live again at the source, where it left a
        ``migrated`` record. The native import took that record for "already imported", so
        the run ended up ``migrated`` on both sides and nothing ran it again."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "signal")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            async with source.worker():
                run = await source.start(wf.id, {"n": 1}, idempotency_key=unique_id("k"))
                await wait_for_events(sink, run.id, "stage.suspended")
                await eventually(lambda: log.count("c") == 1)
            await _moved(source, target, run.id)
            await _moved(target, source, run.id)
            back = await source.get_run(run.id)
            assert back.status not in (RunStatus.MIGRATED, RunStatus.COMPLETED), back.status
            assert back.stage("c").status == "completed" and back.stage("c").output == "c"
            same = await source.start(wf.id, {"n": 1}, idempotency_key=run.idempotency_key)
            assert same.id == run.id  # the idempotency key came back with it
            assert (await source.signal(run.id, "go", "home")).delivered
            async with source.worker():
                info = await source.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == ["home", "c"]
        assert (log.count("a"), log.count("c"), log.count("d"), log.count("x")) == (1, 1, 1, 1)
        # each move has its own run.migrated event: the second had the first's id, and a sink
        # that drops repeated ids (as MemorySink.for_run does) lost it
        moves = [e for e in sink.for_run(run.id) if e.type == "run.migrated"]
        assert [e.data["target"] for e in moves] == [target.driver_name, source.driver_name]

    async def test_moving_a_run_to_the_engine_it_is_on_is_refused(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """``migrate_run(engine, engine, ...)`` marked the run migrated to where it already
        was (the import found it there) and nothing ran it again."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "plain")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, _target):
            run = await source.start(wf.id, {"n": 1})
            with pytest.raises(MigrationError, match="same engine"):
                await migrate_run(source, source, run.id)
            with pytest.raises(MigrationError, match="same engine"):
                await migrate_runs(source, source, workflow_ids=[wf.id], drain=True)
            assert (await source.get_run(run.id)).status == RunStatus.PENDING
            async with source.worker():
                info = await source.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == ["b", "c"]

    async def test_a_selection_that_names_nothing_movable_is_refused(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """``migrate_runs`` (``wfe migrate``) naming a run that is not on the source, a
        misspelled status, or one id given as a string selected nothing and reported an
        empty move ("moved: 0"); each is an error now, and nothing moves."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "plain")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            run = await source.start(wf.id, {"n": 1})
            with pytest.raises(RunNotFoundError):
                await migrate_runs(source, target, run_ids=[run.id, "no-such-run"])
            bad: list[dict[str, Any]] = [
                {"statuses": ["runing"]},
                {"workflow_ids": wf.id},
                {"run_ids": run.id},
            ]
            for selection in bad:
                with pytest.raises(InvalidInputError):
                    await migrate_runs(source, target, **selection)
            assert (await source.get_run(run.id)).status == RunStatus.PENDING
            with pytest.raises(RunNotFoundError):
                await target.get_run(run.id)

    async def test_a_wait_that_is_not_a_number_of_seconds_is_refused(
        self, migration_pair: tuple[Harness, Harness], tmp_path: Path
    ) -> None:
        """``wait=nan`` made a deadline that never passes (``export_run`` and ``wfe migrate
        --wait nan`` waited for ever while a stage ran, ``--drain-timeout nan`` drained for
        ever) and a string raised a TypeError: refused before anything is frozen."""
        log = ExecutionLog(tmp_path / "log")
        wf = _workflow(log, "plain")
        sink = MemorySink()
        async with _pair(migration_pair, Registry([wf]), sink) as (source, target):
            run = await source.start(wf.id, {"n": 1})
            bad_waits: list[Any] = [float("nan"), -1, "5"]
            for bad in bad_waits:
                with pytest.raises(InvalidInputError, match="wait must be"):
                    await source.export_run(run.id, wait=bad)
                with pytest.raises(InvalidInputError, match="wait must be"):
                    await migrate_run(source, target, run.id, wait=bad)
            with pytest.raises(InvalidInputError, match="drain_timeout must be"):
                await migrate_runs(
                    source, target, workflow_ids=[wf.id], drain=True, drain_timeout=float("nan")
                )
            await _moved(source, target, run.id)  # nothing was frozen, nor drained
            async with target.worker():
                info = await target.wait(run.id, timeout=60)
        assert info.status == RunStatus.COMPLETED and info.output == ["b", "c"]
