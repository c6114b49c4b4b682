"""S12 redrive, S13 pinned versions."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import VersioningBehavior
from temporalio.client import Client

from driver_temporal._start import StartDocument
from engine_port import MemorySink, Registry, Retry, StageContext, Workflow
from engine_port.errors import InvalidRedriveError, UnsupportedFeatureError

from .conftest import EngineFactory, trace

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


async def test_s12_redrive_from_last_failure_start_and_stage(make_engine: EngineFactory) -> None:
    counts = {"a": 0, "b": 0, "c": 0, "steps": 0}
    broken = {"c": True}
    wf = Workflow("redrivable", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> str:
        counts["a"] += 1
        return "A"

    @a.compensation
    async def undo_a(ctx: StageContext[In], out: str) -> None:
        pass

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        counts["b"] += 1
        return "B"

    @wf.stage(after=[b], retry=Retry(max_attempts=1, initial_interval=timedelta(0)))
    async def c(ctx: StageContext[In]) -> str:
        counts["c"] += 1

        def journaled() -> int:
            counts["steps"] += 1
            return 42

        v = await ctx.step.run("kept", journaled)
        if broken["c"]:
            raise RuntimeError("c is broken")
        return f"{ctx.output_of('a')}{ctx.output_of('b')}C{v}"

    sink = MemorySink()
    engine = make_engine(Registry([wf]), sink=sink)
    async with engine, engine.worker():
        run = await engine.start("redrivable", {})
        failed = await engine.wait(run.id, timeout=30)
        assert failed.status == "failed"
        broken["c"] = False
        again = await engine.redrive(run.id, from_="last_failure")
        assert again.id == run.id and again.redrive_count == 1
        done = await engine.wait(run.id, timeout=30)
        assert done.status == "completed" and done.output == "ABC42"
        assert counts == {"a": 1, "b": 1, "c": 2, "steps": 1}
        events = trace(sink, run)
        i = events.index(("run.redriven", None))
        assert events[i - 1] == ("run.failed", None)
        assert events[i + 1 :] == [
            ("stage.started", "c"),
            ("stage.completed", "c"),
            ("run.completed", None),
        ]
        await engine.redrive(run.id, from_="b")
        done = await engine.wait(run.id, timeout=30)
        assert done.status == "completed" and done.redrive_count == 2
        assert counts == {"a": 1, "b": 2, "c": 3, "steps": 2}
        await engine.redrive(run.id, from_="start")
        done = await engine.wait(run.id, timeout=30)
        assert counts == {"a": 2, "b": 3, "c": 4, "steps": 3}
    trace(sink, run)  # seq stays gap-free across redrives


def versioned(version: str) -> Workflow[In]:
    wf = Workflow("pinned", input=In, version=version)

    @wf.stage
    async def which(ctx: StageContext[In]) -> str:
        return version

    @wf.stage(after=[which])
    async def wait(ctx: StageContext[In]) -> str:
        await ctx.step.sleep("nap", timedelta(milliseconds=50))
        return str(ctx.output_of("which"))

    return wf


def started_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs started from here on are of the code before ``StartDocument.repins_in_place``."""
    made = StartDocument.for_engine.__func__  # type: ignore[attr-defined]

    def older(cls: type[StartDocument], *args: Any, **kwargs: Any) -> StartDocument:
        doc: StartDocument = made(cls, *args, **kwargs)
        return doc.model_copy(update={"repins_in_place": False})

    monkeypatch.setattr(StartDocument, "for_engine", classmethod(older))


async def pinned_to(address: str, run_id: str) -> tuple[str, str, str]:
    """(task queue, behaviour, deployment:build) of a finished run, from Temporal itself."""
    client = await Client.connect(address)
    desc = await client.get_workflow_handle(run_id).describe()
    info = desc.raw_description.workflow_execution_info
    vi = info.versioning_info
    return (
        info.task_queue,
        VersioningBehavior.Name(vi.behavior),
        f"{vi.deployment_version.deployment_name}:{vi.deployment_version.build_id}",
    )


async def test_s13_pinned_versions(make_engine: EngineFactory, temporal_address: str) -> None:
    e1 = make_engine(Registry([versioned("v1")]))
    e2 = make_engine(Registry([versioned("v2")]))
    async with e1, e2:
        old = await e1.start("pinned", {})
        stranded = await e1.start("pinned", {})
        assert old.version == "v1"
        async with e2.worker():
            new = await e2.start("pinned", {})
            assert new.version == "v2"
            assert (await e2.wait(new.id, timeout=30)).output == "v2"
            await asyncio.sleep(0.5)
            assert (await e2.get_run(old.id)).status == "pending"
            versions = {}
            for _ in range(50):
                versions = {v.version: v for v in await e2.list_versions()}
                if "v1" in versions and versions["v1"].active_runs == 2:
                    break
                await asyncio.sleep(0.1)
            v1 = versions["v1"]
            assert (v1.active_runs, v1.served_here, v1.drained) == (2, False, False)
            assert versions["v2"].served_here and versions["v2"].latest
            async with e1.worker():  # a v1 worker appears: the v1 run finishes on v1
                done = await e1.wait(old.id, timeout=30)
                assert done.output == "v1" and done.version == "v1"
                assert (await e1.wait(stranded.id, timeout=30)).output == "v1"
            stranded2 = await e1.start("pinned", {"n": 2})
            # bad input changes nothing: the stranded run is not terminated first
            with pytest.raises(InvalidRedriveError):
                await e2.redrive(stranded2.id, from_="nope", version="latest")
            assert (await e2.get_run(stranded2.id)).status == "pending"
            repinned = await e2.redrive(stranded2.id, version="latest")
            assert repinned.version == "v2"
            done2 = await e2.wait(stranded2.id, timeout=30)
            assert done2.status == "completed" and done2.output == "v2"
    # versions are Worker Deployment versions of one task queue, runs PINNED to theirs
    tq = e1.task_queue("pinned")
    dep = tq.replace(".", "_")
    assert await pinned_to(temporal_address, old.id) == (
        tq,
        "VERSIONING_BEHAVIOR_PINNED",
        f"{dep}:v1",
    )
    assert await pinned_to(temporal_address, new.id) == (
        tq,
        "VERSIONING_BEHAVIOR_PINNED",
        f"{dep}:v2",
    )
    assert (await pinned_to(temporal_address, stranded2.id))[2] == f"{dep}:v2"


async def test_list_versions_without_the_workflow_in_the_registry(
    make_engine: EngineFactory,
) -> None:
    """``wfe versions`` without --app (an engine whose registry is empty) listed no version
    on Temporal, runs waiting or not; the native driver lists every version it knows."""
    # (no worker: the cancel() at the end would wait its default 10 s for one to end the run)
    e1 = make_engine(Registry([versioned("v1")]), options={"cancel_wait": 0.2})
    bare = make_engine(Registry([]))
    async with e1, bare:
        run = await e1.start("pinned", {})  # no worker: it stays pending, an active run
        await e1.drain(["pinned"], "native")
        listed: list[tuple[str, str, int, bool, str | None]] = []
        for _ in range(100):  # (visibility is eventually consistent)
            listed = [
                (v.workflow_id, v.version, v.active_runs, v.served_here, v.new_runs_to)
                for v in await bare.list_versions()
            ]
            if listed and listed[0][2] == 1:  # (the deployment lists v1 before visibility
                break  # shows its pending run)
            await asyncio.sleep(0.1)
        assert listed == [("pinned", "v1", 1, False, "native")]
        await e1.drain(["pinned"], None)
        await e1.cancel(run.id)


async def test_redrive_without_the_workflow_in_the_registry(make_engine: EngineFactory) -> None:
    """``wfe redrive RUN`` without --app (an engine whose registry is empty) raised "no
    workflow is registered" on Temporal; the run's own version is redriven from the graph
    it started with (as the native driver reads it from its database), and a worker of
    that version runs it."""
    calls: list[int] = []
    wf = Workflow("fails-once", input=In)

    @wf.stage(retry=Retry(max_attempts=1, initial_interval=timedelta(0)))
    async def only(ctx: StageContext[In]) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the first try fails")
        return "ok"

    e1 = make_engine(Registry([wf]))
    bare = make_engine(Registry([]))
    async with e1, bare:
        async with e1.worker():
            run = await e1.start("fails-once", {})
            assert (await e1.wait(run.id, timeout=30)).status == "failed"
        with pytest.raises(InvalidRedriveError):
            await bare.redrive(run.id, from_="no-such-stage")  # checked against that graph
        again = await bare.redrive(run.id)
        assert (again.version, again.redrive_count) == (run.version, 1)
        async with e1.worker():
            done = await e1.wait(run.id, timeout=30)
        assert (done.status, done.output, len(calls)) == ("completed", "ok", 2)


async def test_a_started_stranded_run_is_not_re_pinned_at_a_loss(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started before ``StartDocument.repins_in_place`` (runs started now are re-pinned
    in place: ``test_repin_in_place.py``) is re-pinned by restarting it from its memo: a run
    whose stage journaled a step and waits, or a pending run that was signalled, would lose
    the step (run again) or the signal. Such a re-pin is refused (UnsupportedFeatureError
    saying what to do) and the run goes on untouched on its own version; before, it was
    ended and started again on v2, re-running the journaled step and dropping the signal."""
    started_before(monkeypatch)
    steps: list[str] = []

    def waiting(version: str) -> Workflow[In]:
        wf = Workflow("pinned-waits", input=In, version=version)

        @wf.stage(signals=["go"])
        async def s(ctx: StageContext[In]) -> str:
            await ctx.step.run("charge", lambda: steps.append(version))
            got = await ctx.step.wait_for_signal("go", timeout=600)
            return f"{version}:{got['v']}"

        return wf

    e1 = make_engine(Registry([waiting("v1")]))
    e2 = make_engine(Registry([waiting("v1"), waiting("v2")]))
    async with e1, e2:
        async with e1.worker():
            run = await e1.start("pinned-waits", {})
            for _ in range(600):
                if (await e1.get_run(run.id)).status == "suspended":
                    break
                await asyncio.sleep(0.05)
            assert (await e1.get_run(run.id)).status == "suspended"
        with pytest.raises(UnsupportedFeatureError, match="start a worker that serves version"):
            await e2.redrive(run.id, version="latest")
        # nothing changed: not restarted, still v1
        kept = await e2.get_run(run.id)
        assert (kept.status, kept.version, kept.redrive_count) == ("suspended", "v1", 0)
        signalled = await e1.start("pinned-waits", {})  # pending: no worker runs it
        await e1.signal(signalled.id, "go", {"v": 2})
        with pytest.raises(UnsupportedFeatureError, match="signals were sent"):
            await e2.redrive(signalled.id, version="latest")
        async with e1.worker():
            await e1.signal(run.id, "go", {"v": 1})
            assert (await e1.wait(run.id, timeout=60)).output == "v1:1"
            assert (await e1.wait(signalled.id, timeout=60)).output == "v1:2"
    assert steps == ["v1", "v1"]  # one charge a run: none ran again
