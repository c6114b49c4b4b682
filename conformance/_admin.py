"""Scenarios: idempotent start, pinned versions, bad input (S11, S13, S16)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

from engine_port import MemorySink, Registry, RunStatus, StageContext, Workflow
from engine_port.errors import (
    DefinitionError,
    IdempotencyConflictError,
    InvalidInputError,
    InvalidRedriveError,
    SerializationError,
    WaitTimeoutError,
    WorkflowDrainedError,
    WorkflowNotFoundError,
)

from ._harness import (
    CONTRACT_MARKS,
    ExecutionLog,
    Harness,
    eventually,
    unique_id,
    wait_for_events,
)
from ._models import Num, Order, says_its_version
from ._trace import check_golden, normalise, run_summary

__all__ = ["BadInputContract", "IdempotencyContract", "VersionContract"]


class IdempotencyContract:
    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s11_idempotent_start(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s11"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            log.hit("a")
            return ctx.input.n

        other = _echo("s11o")
        key = unique_id("order")
        async with harness.engine(Registry([wf, other]), MemorySink()) as engine:
            first = await engine.start(wf.id, {"n": 1}, idempotency_key=key)
            second = await engine.start(wf.id, {"n": 1}, idempotency_key=key)
            assert second.id == first.id
            assert first.idempotency_key == key
            with pytest.raises(IdempotencyConflictError):
                await engine.start(wf.id, {"n": 2}, idempotency_key=key)
            # the key with another workflow (the message said "a different input")
            with pytest.raises(IdempotencyConflictError, match="different workflow or input"):
                await engine.start(other.id, {"n": 1}, idempotency_key=key)
            key2 = unique_id("burst")
            runs = await asyncio.gather(
                *(engine.start(wf.id, {"n": 5}, idempotency_key=key2) for _ in range(8))
            )
            assert len({r.id for r in runs}) == 1
            async with engine.worker():
                for rid in {first.id, runs[0].id}:
                    assert (await engine.wait(rid, timeout=60)).status == RunStatus.COMPLETED
            mine = await engine.list_runs(workflow_id=wf.id)
            assert len(mine) == 2
            again = await engine.start(wf.id, {"n": 1}, idempotency_key=key)
            assert again.id == first.id and again.status == RunStatus.COMPLETED
        assert log.count("a") == 2

    async def test_s11_a_purged_run_is_gone_and_its_key_starts_a_new_run(
        self, harness: Harness
    ) -> None:
        """Once ``purge`` has counted a run, the run is gone on every driver: ``get_run`` and
        ``wait`` raise RunNotFoundError, ``list_runs`` does not list it, and a start with its
        idempotency key starts a new run (even with another input) instead of returning the
        purged one. On Temporal, which deletes executions asynchronously, ``get_run`` read the
        purged run for 30 s or more and a keyed start returned it. (The new run's id may be
        the purged one's: Temporal derives it from the key; native gives a new id.)"""
        from engine_port.errors import RunNotFoundError

        wf = _echo("s11p")
        key = unique_id("purged")
        async with harness.engine(Registry([wf]), MemorySink()) as engine:
            async with engine.worker():
                keyed = await engine.start(wf.id, {"n": 1}, idempotency_key=key)
                plain = await engine.start(wf.id, {"n": 1})
                for run in (keyed, plain):
                    assert (await engine.wait(run.id, timeout=60)).status == RunStatus.COMPLETED
            kept = await engine.start(wf.id, {"n": 3})  # pending (no worker): not purged
            await _listed(engine, wf.id, RunStatus.COMPLETED)
            purged: list[int] = []

            async def gone(run_id: str) -> bool:
                try:
                    await engine.get_run(run_id)
                except RunNotFoundError:
                    return True
                return False

            async def purge() -> bool:
                # (Temporal: the listing purge reads catches up with a run's end a moment
                # after it ended; a purge right after may find nothing yet)
                purged.append(await engine.purge(older_than=0))
                return await gone(keyed.id) and await gone(plain.id)

            await eventually(purge, timeout=90, interval=0.2, what="both runs to be purged")
            # (at least these two: in `wfe conformance`'s scratch area the runs of the
            # scenarios before it are finished too, and purged with them)
            assert sum(purged) >= 2, purged
            for run in (keyed, plain):
                with pytest.raises(RunNotFoundError):
                    await engine.get_run(run.id)
                with pytest.raises(RunNotFoundError):
                    await engine.wait(run.id, timeout=1)
            listed = {r.id for r in await engine.list_runs(workflow_id=wf.id)}
            assert not listed & {keyed.id, plain.id}, listed
            assert (await engine.get_run(kept.id)).status == RunStatus.PENDING
            # the key is free again: a new run, with the new input (no IdempotencyConflict)
            again = await engine.start(wf.id, {"n": 2}, idempotency_key=key)
            assert again.status == RunStatus.PENDING
            assert again.input == {"n": 2} and again.idempotency_key == key
            assert again.created_at and keyed.created_at
            assert again.created_at > keyed.created_at
            repeat = await engine.start(wf.id, {"n": 2}, idempotency_key=key)
            assert repeat.id == again.id  # and it is idempotent again
            async with engine.worker():
                done = await engine.wait(again.id, timeout=60)
            assert done.status == RunStatus.COMPLETED and done.output == 2


class VersionContract:
    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s13_pinned_versions(self, harness: Harness, tmp_path: Path) -> None:
        if not harness.capabilities.pinned_versions:
            pytest.skip("driver lacks capability pinned_versions")
        log = ExecutionLog(tmp_path / "log")
        wid = unique_id("s13")

        def build(version: str) -> Workflow[Num]:
            wf = Workflow(wid, input=Num, version=version)

            @wf.stage
            async def a(ctx: StageContext[Num]) -> str:
                log.hit(f"a@{version}")
                await ctx.step.wait_for_signal("go")
                return version

            return wf

        v1, v2 = build("v1"), build("v2")
        r1, r2 = Registry([v1]), Registry([v2])
        sink = MemorySink()
        async with harness.engine(r1, sink) as e1, harness.engine(r2, sink) as e2:
            async with e1.worker():
                run = await e1.start(wid, {})
                await wait_for_events(sink, run.id, "stage.suspended")
            assert run.version == "v1"
            await e2.signal(run.id, "go", {})
            async with e2.worker():
                new = await e2.start(wid, {})
                assert new.version == "v2"
                await e2.signal(new.id, "go", {})
                assert (await e2.wait(new.id, timeout=60)).output == "v2"
                still = await e2.get_run(run.id)
                assert still.status in (RunStatus.SUSPENDED, RunStatus.RUNNING, RunStatus.PENDING)
                versions = {(v.workflow_id, v.version): v for v in await e2.list_versions()}
                old = versions[(wid, "v1")]
                assert (old.active_runs, old.served_here, old.drained) == (1, False, False)
                assert versions[(wid, "v2")].served_here
                assert log.count("a@v1") == 1  # the v2 worker never ran the v1 run
            async with e1.worker():
                done = await e1.wait(run.id, timeout=60)
            assert done.output == "v1"

            async def drained() -> bool:
                # (Temporal counts a version's active runs from visibility, which sees the run
                # closed a moment after it closed: on a loaded host, after ``wait`` returned)
                now = {(v.workflow_id, v.version): v for v in await e1.list_versions()}
                return now[(wid, "v1")].drained

            await eventually(drained, what="v1 drained once its one run ended")

    async def test_list_versions_says_where_new_runs_of_a_drained_workflow_go(
        self, harness: Harness
    ) -> None:
        """``drained`` is about a version's active runs; ``new_runs_to`` is what an operator
        asks after ``drain()``: whether new runs still start here, and if not, where they go.
        ``wfe versions`` showed only ``drained``, True for an idle version whose workflow
        took new runs and False for a busy one whose workflow refused them."""
        wid = unique_id("drained-to")
        async with harness.engine(Registry([says_its_version(wid, "v1")]), MemorySink()) as e:

            async def where() -> dict[str, str | None]:
                return {
                    v.version: v.new_runs_to
                    for v in await e.list_versions()
                    if v.workflow_id == wid
                }

            assert await where() == {"v1": None}
            await e.drain([wid], "elsewhere")
            assert await where() == {"v1": "elsewhere"}
            with pytest.raises(WorkflowDrainedError) as refused:
                await e.start(wid, {})
            assert refused.value.target == "elsewhere"
            await e.drain([wid], None)
            assert await where() == {"v1": None}

    async def test_a_workflow_object_starts_its_own_version(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """``start(wf, ...)`` with a Workflow object runs that object's version (a registry that
        serves two versions of one workflow), ``start(wf.id, ...)`` the registry's latest, and
        ``version=`` wins over both; an object whose version the registry does not hold is
        refused. The Temporal driver used to run the latest version for every object."""
        if not harness.capabilities.pinned_versions:
            pytest.skip("driver lacks capability pinned_versions")
        wid = unique_id("own-version")
        v1, v2 = says_its_version(wid, "v1"), says_its_version(wid, "v2")
        async with harness.engine(Registry([v1, v2]), MemorySink()) as engine:
            async with engine.worker():
                runs = {
                    "object v1": await engine.start(v1, {}),
                    "object v2": await engine.start(v2, {}),
                    "id": await engine.start(wid, {}),
                    "object v1, version v2": await engine.start(v1, {}, version="v2"),
                }
                ran = {}
                for what, run in runs.items():
                    done = await engine.wait(run.id, timeout=60)
                    ran[what] = (run.version, done.version, done.output)
            with pytest.raises(WorkflowNotFoundError):
                await engine.start(says_its_version(wid, "v3"), {})
        assert ran == {
            "object v1": ("v1", "v1", "v1"),
            "object v2": ("v2", "v2", "v2"),
            "id": ("v2", "v2", "v2"),
            "object v1, version v2": ("v2", "v2", "v2"),
        }

    async def test_s13_redrive_repins_to_latest(self, harness: Harness, tmp_path: Path) -> None:
        if not (harness.capabilities.pinned_versions and harness.capabilities.redrive):
            pytest.skip("driver lacks capability pinned_versions/redrive")
        wid = unique_id("s13r")

        def build(version: str, fail: bool) -> Workflow[Num]:
            wf = Workflow(wid, input=Num, version=version)

            @wf.stage
            async def a(ctx: StageContext[Num]) -> str:
                if fail:
                    from engine_port import NonRetryableError

                    raise NonRetryableError("v1 is broken")
                return version

            return wf

        v1, v2 = build("v1", True), build("v2", False)
        sink = MemorySink()
        async with (
            harness.engine(Registry([v1]), sink) as e1,
            harness.engine(Registry([v1, v2]), sink) as e2,
        ):
            async with e1.worker():
                run = await e1.start(wid, {})
                assert (await e1.wait(run.id, timeout=60)).status == RunStatus.FAILED
            async with e2.worker():
                moved = await e2.redrive(run.id, version="latest")
                assert moved.version == "v2"
                done = await e2.wait(run.id, timeout=60)
        assert done.status == RunStatus.COMPLETED and done.output == "v2"

    def _repins(self, harness: Harness) -> None:
        caps = harness.capabilities
        if not (caps.pinned_versions and caps.redrive and caps.repin_active):
            pytest.skip("driver lacks capability pinned_versions/redrive/repin_active")

    async def test_s13_redrive_repins_a_stranded_pending_run(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """S13: a run started under R1 (wf@v1) that no R1 worker ever ran stays pending with
        only an R2 worker (wf@v2) alive; ``list_versions()`` shows v1 with one active run,
        not served, not drained; ``redrive(run, version="latest")`` re-pins it to v2 (same
        run id, ``run.redriven`` naming v2) and the R2 worker finishes it with v2's body.
        Before, redrive refused every run that had not ended: the run was stuck."""
        self._repins(harness)
        log = ExecutionLog(tmp_path / "log")
        wid = unique_id("s13p")

        def build(version: str) -> Workflow[Num]:
            wf = Workflow(wid, input=Num, version=version)

            @wf.stage
            async def a(ctx: StageContext[Num]) -> str:
                log.hit(f"a@{version}")
                return f"a@{version}"

            @wf.stage(after=[a])
            async def b(ctx: StageContext[Num]) -> str:
                log.hit(f"b@{version}")
                return f"{ctx.output_of('a')}+b@{version}"

            return wf

        sink = MemorySink()
        async with (
            harness.engine(Registry([build("v1")]), sink) as e1,
            harness.engine(Registry([build("v2")]), sink) as e2,
        ):
            run = await e1.start(wid, {})  # no R1 worker ever runs
            assert run.version == "v1"
            async with e2.worker():
                other = await e2.start(wid, {})  # the R2 worker works...
                assert (await e2.wait(other.id, timeout=60)).output == "a@v2+b@v2"
                # ...and leaves the v1 run alone
                assert (await e2.get_run(run.id)).status == RunStatus.PENDING

                async def stranded() -> bool:
                    versions = {(v.workflow_id, v.version): v for v in await e2.list_versions()}
                    old = versions.get((wid, "v1"))
                    return old is not None and (
                        old.active_runs,
                        old.served_here,
                        old.drained,
                    ) == (1, False, False)

                await eventually(stranded, timeout=60, interval=0.2, what="v1 shown stranded")
                moved = await e2.redrive(run.id, version="latest")
                assert (moved.id, moved.version) == (run.id, "v2")
                assert moved.status not in (RunStatus.COMPLETED, RunStatus.FAILED)
                done = await e2.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed", timeout=60)
        assert (done.status, done.output, done.version) == (
            RunStatus.COMPLETED,
            "a@v2+b@v2",
            "v2",
        )
        assert log.count("a@v1") == log.count("b@v1") == 0
        assert log.count("a@v2") == log.count("b@v2") == 2  # (this run and the other one)
        redriven = [e for e in events if e.type == "run.redriven"]
        assert len(redriven) == 1 and redriven[0].data["version"] == "v2"
        types = [e.type for e in events]
        assert types.index("run.redriven") < types.index("stage.started")

    async def test_s13_redrive_repins_a_suspended_run_keeping_its_journal(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """S13 for a suspended run: a v1 worker ran stage a until it waited for signal "go"
        (step x journaled), then went away. With only a v2 worker alive the run stays
        suspended; a signal for the next stage, sent meanwhile, is queued. After
        ``redrive(run, version="latest")`` and the signal "go", the v2 worker resumes a with
        v2's body (x is not run again: its v1 result comes from the journal) and b takes
        the queued signal: nothing is re-run, nothing dropped."""
        self._repins(harness)
        log = ExecutionLog(tmp_path / "log")
        wid = unique_id("s13s")

        def x(version: str) -> str:
            log.hit(f"x@{version}")
            return f"x@{version}"

        def build(version: str) -> Workflow[Num]:
            wf = Workflow(wid, input=Num, version=version)

            @wf.stage
            async def a(ctx: StageContext[Num]) -> str:
                log.hit(f"a@{version}")
                got = await ctx.step.run("x", x, version)
                go = await ctx.step.wait_for_signal("go")
                return f"{got}/a@{version}/{go['n']}"

            @wf.stage(after=[a])
            async def b(ctx: StageContext[Num]) -> str:
                log.hit(f"b@{version}")
                more = await ctx.step.wait_for_signal("more")
                return f"{ctx.output_of('a')}/b@{version}/{more['n']}"

            return wf

        sink = MemorySink()
        async with (
            harness.engine(Registry([build("v1")]), sink) as e1,
            harness.engine(Registry([build("v2")]), sink) as e2,
        ):
            async with e1.worker():
                run = await e1.start(wid, {})
                await wait_for_events(sink, run.id, "stage.suspended", timeout=60)
            queued = await e2.signal(run.id, "more", {"n": 2})
            assert not queued.delivered
            async with e2.worker():
                assert (await e2.get_run(run.id)).status == RunStatus.SUSPENDED
                moved = await e2.redrive(run.id, version="latest")
                assert (moved.id, moved.version, moved.status) == (
                    run.id,
                    "v2",
                    RunStatus.SUSPENDED,
                )
                assert [s.status for s in moved.stages if s.id == "a"] == ["suspended"]
                await e2.signal(run.id, "go", {"n": 1})
                done = await e2.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.completed", timeout=60)
        assert done.status == RunStatus.COMPLETED, done.error
        assert done.output == "x@v1/a@v2/1/b@v2/2"
        assert log.counts() == {"a@v1": 1, "x@v1": 1, "a@v2": 1, "b@v2": 1}
        types = [e.type for e in events]
        assert types.count("stage.started") == 2  # a resumed its attempt: no second start
        assert types.count("run.redriven") == 1

    async def test_s13_repin_refusals(self, harness: Harness, tmp_path: Path) -> None:
        """What a redrive of a run that has not ended refuses, leaving the run as it was:
        a version whose stages differ (InvalidRedriveError), a ``from_`` (it applies to a
        terminal run: InvalidRedriveError), a run with a stage attempt running now
        (RunNotActiveError saying to wait or cancel) and a run frozen for a migration
        (MigrationError); a re-pin to the run's own version changes nothing."""
        self._repins(harness)
        from engine_port.errors import MigrationError, RunNotActiveError, UnsupportedFeatureError

        wid = unique_id("s13n")
        release = asyncio.Event()

        def build(version: str, stage: str = "a") -> Workflow[Num]:
            wf = Workflow(wid, input=Num, version=version)

            @wf.stage(id=stage)
            async def body(ctx: StageContext[Num]) -> str:
                if ctx.input.n:  # a long attempt, until the test releases it
                    await release.wait()
                return version

            return wf

        sink = MemorySink()
        async with (
            harness.engine(Registry([build("v1")]), sink) as e1,
            harness.engine(Registry([build("v2"), build("v3", stage="c")]), sink) as e2,
        ):
            parked = await e1.start(wid, {})  # pending: no v1 worker yet
            with pytest.raises(InvalidRedriveError, match="stages differ"):
                await e2.redrive(parked.id, version="v3")
            for from_ in ("start", "a"):
                with pytest.raises(InvalidRedriveError, match="applies to a terminal run"):
                    await e2.redrive(parked.id, from_, version="v2")
            same = await e1.redrive(parked.id, version="v1")  # already there: nothing to do
            assert (same.version, same.status, same.redrive_count) == ("v1", RunStatus.PENDING, 0)
            frozen = True
            try:
                await e1.export_run(parked.id)
            except UnsupportedFeatureError:
                frozen = False
            if frozen:
                with pytest.raises(MigrationError):
                    await e2.redrive(parked.id, version="latest")
                await e1.abort_export(parked.id)
            after = await e2.get_run(parked.id)
            # (not ended, on its version, not redriven. A driver whose export let a
            # workflow-only worker of v1 run the run's first task (Temporal's, so that a run
            # no worker serves answers a migration) shows its first stage scheduled once the
            # export is aborted: running, though no worker of v1 runs it yet)
            started = (RunStatus.PENDING, RunStatus.RUNNING) if frozen else (RunStatus.PENDING,)
            assert (after.version, after.redrive_count) == ("v1", 0)
            assert after.status in started
            async with e1.worker():
                busy = await e1.start(wid, {"n": 1})
                await wait_for_events(sink, busy.id, "stage.started", timeout=60)
                with pytest.raises(RunNotActiveError, match="running an attempt now"):
                    await e2.redrive(busy.id, version="latest")
                release.set()
                assert (await e1.wait(busy.id, timeout=60)).output == "v1"
                assert (await e1.wait(parked.id, timeout=60)).output == "v1"
        events = [e.type for e in sink.for_run(parked.id) + sink.for_run(busy.id)]
        assert "run.redriven" not in events

    async def test_redrive_onto_a_version_with_other_stages_is_refused(
        self, harness: Harness
    ) -> None:
        """A failed run cannot be redriven onto a version whose stages are not its own (the
        port's redrive_plan): InvalidRedriveError, and the run stays as it was."""
        if not (harness.capabilities.pinned_versions and harness.capabilities.redrive):
            pytest.skip("driver lacks capability pinned_versions/redrive")
        wid = unique_id("s13x")
        v1 = Workflow(wid, input=Num, version="v1")

        @v1.stage
        async def a(ctx: StageContext[Num]) -> str:
            from engine_port import NonRetryableError

            raise NonRetryableError("v1 is broken")

        v2 = Workflow(wid, input=Num, version="v2")

        @v2.stage
        async def b(ctx: StageContext[Num]) -> str:  # another stage id: not a's run
            return "v2"

        async with (
            harness.engine(Registry([v1, v2]), MemorySink()) as engine,
            engine.worker(),
        ):
            run = await engine.start(wid, {}, version="v1")
            assert (await engine.wait(run.id, timeout=60)).status == RunStatus.FAILED
            with pytest.raises(InvalidRedriveError, match="stages differ"):
                await engine.redrive(run.id, version="v2")
            after = await engine.get_run(run.id)
        assert (after.status, after.version) == (RunStatus.FAILED, "v1")
        assert [s.id for s in after.stages] == ["a"]


class _Looked(BaseModel):
    """An input model whose validators raise what user code raises by mistake."""

    region: str

    @field_validator("region")
    @classmethod
    def _known(cls, value: str) -> str:
        if value == "venus":
            raise TypeError("regions are looked up by code")
        return {"eu": "eu", "us": "us"}[value]  # KeyError for any other region


class BadInputContract:
    pytestmark = CONTRACT_MARKS  # async tests under pytest-asyncio strict or auto mode

    async def test_s16_bad_input(self, harness: Harness, tmp_path: Path) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s16"), input=Order)

        @wf.stage
        async def a(ctx: StageContext[Order]) -> str:
            log.hit("a")
            return ctx.input.order_id

        async with harness.engine(Registry([wf]), MemorySink()) as engine:
            with pytest.raises(WorkflowNotFoundError):
                await engine.start("no-such-workflow", {})
            with pytest.raises(InvalidInputError) as err:
                await engine.start(wf.id, {"order_id": "1", "total": "lots"})
            assert "total" in str(err.value)
            with pytest.raises(InvalidInputError):
                await engine.start(wf.id, {"total": 1.0})
            assert await engine.list_runs(workflow_id=wf.id) == []
        assert log.entries() == []

    async def test_s16_an_input_validator_raising_any_error_is_bad_input(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        """An input model whose validator raises something other than ValueError (a KeyError
        of a lookup table, a TypeError) refused the input with that raw exception from inside
        pydantic on every driver; it is ``InvalidInputError`` naming the model and the error,
        and no run is created."""
        wf = Workflow(unique_id("s16v"), input=_Looked)

        @wf.stage
        async def a(ctx: StageContext[_Looked]) -> str:
            return ctx.input.region

        async with harness.engine(Registry([wf]), MemorySink()) as engine:
            for bad in ("mars", "venus"):
                with pytest.raises(InvalidInputError, match=r"_Looked raised (KeyError|TypeError)"):
                    await engine.start(wf.id, {"region": bad})
            assert await engine.list_runs(workflow_id=wf.id) == []

    async def test_s16_bad_listing_arguments(self, harness: Harness) -> None:
        """``list_runs`` arguments a caller can get wrong are refused with a typed error on
        every driver (a misspelled status listed nothing; a negative limit listed every run on
        native and none on Temporal; a limit given as text raised a TypeError from inside the
        Temporal driver); ``limit=0`` lists nothing and statuses are matched as given."""
        wf = _echo("s16l")
        async with harness.engine(Registry([wf]), MemorySink()) as engine:
            run = await _completed(engine, wf)
            for bad in (
                {"status": "complete"},
                {"status": ["completed", "done"]},
                {"status": 3},
                {"limit": -1},
                {"limit": "5"},
                {"limit": True},
                {"id_prefix": 7},
            ):
                with pytest.raises(InvalidInputError):
                    await engine.list_runs(workflow_id=wf.id, **bad)
            assert await engine.list_runs(workflow_id=wf.id, limit=0) == []
            mine = await _listed(engine, wf.id, [RunStatus.COMPLETED, "failed"])
            assert [r.id for r in mine] == [run.id]
            assert await _listed(engine, wf.id, "running") == []

    async def test_s16_bad_purge_ages(self, harness: Harness) -> None:
        """``purge(older_than=...)`` takes a timedelta or seconds, finite and 0 or more: a
        negative age put the cutoff in the future and purged every finished run on both
        drivers; text or None raised a bare ValueError or TypeError from inside them. A
        refused call purges nothing."""
        wf = _echo("s16p")
        async with harness.engine(Registry([wf]), MemorySink()) as engine:
            run = await _completed(engine, wf)
            bads: list[Any] = [
                -1,
                -0.5,
                timedelta(seconds=-5),
                math.nan,
                math.inf,
                "7d",
                None,
                True,
            ]
            for bad in bads:
                with pytest.raises(InvalidInputError):
                    await engine.purge(bad)
            assert (await engine.get_run(run.id)).status == RunStatus.COMPLETED
            assert await engine.purge(timedelta(days=1)) == 0  # (it finished a moment ago)

    async def test_s16_bad_worker_options(self, harness: Harness) -> None:
        """``worker(**options)`` refuses an option its driver does not take (code moved from
        the other driver got a bare TypeError) and a number out of range (native
        ``concurrency=-1`` started a worker that never ran a stage: the run waited for
        ever) with InvalidInputError, before any worker starts."""
        wf = _echo("s16o")
        async with harness.engine(Registry([wf]), MemorySink()) as engine:
            bad: list[dict[str, Any]] = [
                {"no_such_option": 1},
                {"concurrency": -1},
                {"concurrency": "5"},
                {"poll_interval": -1.0},
                {"shutdown_timeout": math.nan},
                {"max_concurrent_activities": 0},
                {"graceful_shutdown_timeout": -1},
            ]
            for options in bad:
                with pytest.raises(InvalidInputError):
                    async with engine.worker(**options):
                        pass
            assert (await _completed(engine, wf)).output == 1

    async def test_s16_bad_wait_timeouts(self, harness: Harness) -> None:
        """``wait(timeout=...)`` takes seconds, 0 or more, or None: anything else is a typed
        error on every driver (text raised a TypeError from inside both drivers, NaN a bare
        TimeoutError on native). A run that has ended is returned even with ``timeout=0``
        (Temporal raised WaitTimeoutError saying it was "still completed")."""
        wf = Workflow(unique_id("s16w"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> int:
            if ctx.input.n:
                await ctx.step.wait_for_signal("go")
            return ctx.input.n

        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            done = await engine.start(wf.id, {"n": 0})
            assert (await engine.wait(done.id, timeout=60)).status == RunStatus.COMPLETED
            parked = await engine.start(wf.id, {"n": 1})
            for bad in ("1", -1, float("nan"), True, [1]):
                with pytest.raises(InvalidInputError):
                    await engine.wait(done.id, timeout=bad)  # type: ignore[arg-type]
            assert (await engine.wait(done.id, timeout=0)).status == RunStatus.COMPLETED
            with pytest.raises(WaitTimeoutError):
                await engine.wait(parked.id, timeout=0)
            await engine.cancel(parked.id)
            ended = await engine.wait(parked.id, timeout=float("inf"))
            assert ended.status == RunStatus.CANCELLED

    async def test_s16_cycle_is_a_definition_error(self) -> None:
        wf = Workflow(unique_id("cyc"), input=Num)

        @wf.stage(after=["b"])
        async def a(ctx: StageContext[Num]) -> None: ...

        @wf.stage(after=["a"])
        async def b(ctx: StageContext[Num]) -> None: ...

        with pytest.raises(DefinitionError):
            Registry([wf])

    async def test_s16_non_json_output_fails_with_compensation(
        self, harness: Harness, tmp_path: Path
    ) -> None:
        log = ExecutionLog(tmp_path / "log")
        wf = Workflow(unique_id("s16s"), input=Num)

        @wf.stage
        async def a(ctx: StageContext[Num]) -> str:
            log.hit("a")
            return "a"

        @wf.stage(after=[a])
        async def bad(ctx: StageContext[Num]) -> Any:
            log.hit("bad")
            return object()

        @a.compensation
        async def undo(ctx: StageContext[Num], out: str) -> None:
            log.hit("undo-a")

        sink = MemorySink()
        async with harness.engine(Registry([wf]), sink) as engine, engine.worker():
            run = await engine.start(wf.id, {})
            info = await engine.wait(run.id, timeout=60)
            events = await wait_for_events(sink, run.id, "run.failed")
        assert info.status == RunStatus.FAILED
        assert info.error is not None and info.error.type == SerializationError.__name__
        assert log.entries() == ["a", "bad", "undo-a"]  # not retried
        check_golden(
            "s16_serialization", {"trace": normalise(events, wf.graph()), "run": run_summary(info)}
        )

    async def test_s16_unknown_run_reads(self, harness: Harness) -> None:
        from engine_port.errors import RunNotFoundError

        async with harness.engine(Registry(), MemorySink()) as engine:
            with pytest.raises(RunNotFoundError):
                await engine.wait("missing", timeout=1)
            with pytest.raises(RunNotFoundError):
                await engine.steps("missing")

    async def test_calls_on_a_closed_engine_say_to_connect(self, harness: Harness) -> None:
        """Every driver raises DriverUnavailableError (the native one raised a bare
        EngineError) and a second worker of one engine in a process either runs (native)
        or is refused with UnsupportedFeatureError (Temporal's one worker per version and
        process: it was temporalio's RuntimeError "Failed creating worker")."""
        from engine_port.errors import DriverUnavailableError, UnsupportedFeatureError

        wf = _echo("closed")
        async with harness.engine(Registry([wf]), MemorySink()) as engine, engine.worker():
            with contextlib.suppress(UnsupportedFeatureError):
                async with engine.worker():
                    pass
            run = await engine.start(wf.id, {"n": 1})  # the first worker still serves
            assert (await engine.wait(run.id, timeout=60)).status == RunStatus.COMPLETED
        for call in (
            engine.get_run(run.id),
            engine.start(wf.id, {"n": 1}),
            engine.list_runs(),
            engine.signal(run.id, "go", 1),
        ):
            with pytest.raises(DriverUnavailableError, match="not connected"):
                await call


def _echo(prefix: str) -> Workflow[Num]:
    """A one-stage workflow whose output is its input's ``n``."""
    wf = Workflow(unique_id(prefix), input=Num)

    @wf.stage
    async def a(ctx: StageContext[Num]) -> int:
        return ctx.input.n

    return wf


async def _completed(engine: Any, wf: Workflow[Num]) -> Any:
    """One run of ``wf`` (n = 1) started and completed with a worker of this engine."""
    async with engine.worker():
        run = await engine.start(wf.id, {"n": 1})
        done = await engine.wait(run.id, timeout=60)
    assert done.status == RunStatus.COMPLETED
    return done


async def _listed(engine: Any, workflow_id: str, status: Any) -> list[Any]:
    """The run listing (Temporal's visibility store catches up with a run's end after it)."""
    for _ in range(100):
        runs = list(await engine.list_runs(workflow_id=workflow_id, status=status))
        if runs or status == "running":
            return runs
        await asyncio.sleep(0.1)
    return []
