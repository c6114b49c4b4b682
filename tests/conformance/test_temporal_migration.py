"""Moving live runs between the native driver (SQLite) and the Temporal driver (the session's
dev server), both directions, through the shared MigrationContract; plus a 500-run mixed
workload drained from native on PostgreSQL to Temporal while new runs keep starting."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conformance import ExecutionLog, Harness, MigrationContract, SettingsHarness
from conformance._harness import eventually
from conformance._models import Num
from conformance._trace import normalise
from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
    migrate_run,
    migrate_runs,
)
from engine_port._routing import RoutingEngine
from engine_port.errors import MigrationError, RunNotFoundError
from tests.support.databases import PostgresSession


def _pair(tmp_path: Path, temporal_server: Any) -> tuple[SettingsHarness, SettingsHarness]:
    blobs = f"file://{tmp_path / 'blobs'}"
    native = SettingsHarness(
        EngineSettings(
            driver="native",
            database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
            blob_url=blobs,
            lease_seconds=3.0,
        ),
        name="native-sqlite",
    )
    temporal = SettingsHarness(
        EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"m-{uuid.uuid4().hex[:10]}",
            blob_url=blobs,
        ),
        # (signal_timeout at its default, 5 s: a signal to a run no worker serves waits it
        # out three times in these scenarios, but a repeat to a run that only the target's
        # migration helper serves must be answered by that helper, which replays the run's
        # whole history for each task: 1.5 s was too short for it on a loaded CI host)
        name="temporal",
    )
    return native, temporal


@pytest.mark.temporal
class TestNativeTemporalMigration(MigrationContract):
    @pytest.fixture(params=["native->temporal", "temporal->native"])
    def migration_pair(
        self, request: pytest.FixtureRequest, temporal_server: Any, tmp_path: Path
    ) -> tuple[Harness, Harness]:
        native, temporal = _pair(tmp_path, temporal_server)
        return (native, temporal) if request.param == "native->temporal" else (temporal, native)


@pytest.mark.temporal
async def test_moving_a_run_into_the_namespace_it_is_in_is_refused(
    temporal_server: Any, tmp_path: Path
) -> None:
    """Two Temporal engines on one namespace: the import found the run being exported and
    took it for "already imported", so the run was marked migrated to where it was and never
    ran again. Now the import refuses, the export is aborted and the run goes on (as on two
    native engines on one database)."""
    _, harness = _pair(tmp_path, temporal_server)
    wf = _mixed_workflow(ExecutionLog(tmp_path / "log"), "plain", uuid.uuid4().hex[:6])
    registry = Registry([wf])
    async with (
        create_engine(harness.settings, registry) as one,
        create_engine(harness.settings, registry) as two,
    ):
        run = await one.start(wf.id, {"n": 1})
        with pytest.raises(MigrationError, match="this very Temporal namespace"):
            await migrate_run(one, two, run.id)
        # (still here and active: the export's helper worker may have begun it)
        assert (await one.get_run(run.id)).status in (RunStatus.PENDING, RunStatus.RUNNING)
        async with one.worker():
            info = await one.wait(run.id, timeout=60)
    assert info.status == RunStatus.COMPLETED and info.output == [1, "b"]


# -- a live workload drained from native (PostgreSQL) to Temporal -------------------------------

N_RUNS = int(os.environ.get("WFE_MIX_RUNS", "500"))


def _mixed_workflow(log: ExecutionLog, kind: str, tag: str) -> Workflow[Num]:
    """plain: a -> b -> c; sleep: b journals step x then sleeps 10 s; signal: b journals x then
    waits for "go". Stage bodies log ``<run>:<stage>`` when they finish, and ``<run>:b:enter``
    each time b's body is entered (a resumed stage re-enters it: the documented replay)."""
    wf = Workflow(f"mix-{kind}-{tag}", input=Num, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Num]) -> int:
        log.hit(f"{ctx.run_id}:a")
        ctx.emit("a.done", {"n": ctx.input.n})
        return ctx.input.n

    @wf.stage(after=[a])
    async def b(ctx: StageContext[Num]) -> Any:
        rid = ctx.run_id
        log.hit(f"{rid}:b:enter")
        result: Any = "b"
        if kind != "plain":
            await ctx.step.run("x", lambda: log.hit(f"{rid}:x"))
        if kind == "sleep":
            await ctx.step.sleep("nap", timedelta(seconds=10))
        if kind == "signal":
            result = await ctx.step.wait_for_signal("go")
        log.hit(f"{rid}:b")
        return result

    @wf.stage(after=[b])
    async def c(ctx: StageContext[Num]) -> list[Any]:
        log.hit(f"{ctx.run_id}:c")
        return [ctx.output_of(a), ctx.output_of(b)]

    return wf


@pytest.mark.temporal
@pytest.mark.postgres
# a deliberately large workload: ~2 min alone here, several times that beside a CPU hog; the
# timeout only catches a hang (rule: no speed assertions in tests)
@pytest.mark.timeout(900)
async def test_drain_500_runs_native_to_temporal_while_starting(  # noqa: PLR0915  one end-to-end drain scenario, read top to bottom
    temporal_server: Any, pg_session: PostgresSession, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    log = ExecutionLog(tmp_path / "log")
    tag = uuid.uuid4().hex[:6]
    wfs = {kind: _mixed_workflow(log, kind, tag) for kind in ("plain", "sleep", "signal")}
    wf_ids = [wf.id for wf in wfs.values()]
    settings = EngineSettings(
        driver="temporal",
        database_url=pg_session.new_schema(),
        blob_url=f"file://{tmp_path / 'blobs'}",
        temporal_address=temporal_server.address,
        task_queue=f"mix-{tag}",
        worker_concurrency=16,
        routes=dict.fromkeys(wf_ids, "native"),
    )
    sink = MemorySink()
    engine = create_engine(settings, Registry(list(wfs.values())), event_sink=sink)
    assert isinstance(engine, RoutingEngine)
    native, temporal = engine.engines["native"], engine.engines["temporal"]
    kinds: dict[str, str] = {}
    order = ["plain", "sleep", "signal"]
    gate = asyncio.Semaphore(16)

    async def start(i: int) -> None:
        kind = order[i % 3]
        async with gate:
            info = await engine.start(wfs[kind].id, {"n": i})
        kinds[info.id] = kind

    signalled: set[str] = set()
    starting_done = asyncio.Event()
    moved_all = asyncio.Event()

    async def signaller() -> None:
        """Every other signal run is signalled as soon as it exists (before or while it moves,
        buffered or consumed on native); the others once the drain is over (on Temporal)."""
        while True:
            mine = [r for r, k in list(kinds.items()) if k == "signal" and r not in signalled]
            todo = mine if moved_all.is_set() else [r for r in mine if r[-1] in "02468ace"]
            if not mine and starting_done.is_set():
                return
            for rid in todo:
                try:
                    res = await engine.signal(rid, "go", {"for": rid})
                except MigrationError:
                    continue  # frozen while it moves: send it again once it landed
                assert not res.already_completed, res  # delivered, or buffered for b
                signalled.add(rid)
            await asyncio.sleep(0.2)

    async def late_starts() -> None:
        for i in range(N_RUNS // 2, N_RUNS):
            await start(i)
            await asyncio.sleep(0.01)
        starting_done.set()

    async with engine, engine.worker():
        await asyncio.gather(*(start(i) for i in range(N_RUNS // 2)))
        await asyncio.sleep(1.0)  # let them spread over pending, running, sleeping, waiting
        starter = asyncio.create_task(late_starts())
        signals = asyncio.create_task(signaller())
        report = await migrate_runs(
            native, temporal, workflow_ids=wf_ids, drain=True, wait=30, drain_timeout=600
        )
        moved_all.set()
        await starter
        await signals
        finals = [await engine.wait(rid, timeout=300) for rid in list(kinds)]
        await eventually(
            lambda: all(any(e.type == "run.completed" for e in sink.for_run(rid)) for rid in kinds),
            timeout=60,
            what="every run.completed at the sink",
        )
        left = await native.list_runs(
            status=[RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED],
            limit=10_000,
        )
        holders: dict[str, list[str]] = {}
        for rid in kinds:
            for name, eng in (("native", native), ("temporal", temporal)):
                try:
                    info = await eng.get_run(rid)
                except RunNotFoundError:
                    continue
                if info.status != RunStatus.MIGRATED:
                    holders.setdefault(rid, []).append(name)
                    assert info.status == RunStatus.COMPLETED, info
                else:
                    assert info.migrated_to == "temporal"

    outcomes = {o: report.count(o) for o in ("moved", "skipped", "left")}
    print(f"migration report: {outcomes}")
    assert len(kinds) == N_RUNS
    assert report.count("left") == 0, [m for m in report.moves if m.outcome == "left"]
    moved = report.count("moved")
    assert moved > 0
    assert left == [], "runs left on the drained source"
    assert all(f.status == RunStatus.COMPLETED for f in finals)
    assert {rid: h for rid, h in holders.items() if len(h) != 1} == {}
    assert len(holders) == N_RUNS
    counts = log.counts()
    for rid, kind in kinds.items():
        for stage in ("a", "b", "c"):
            assert counts.get(f"{rid}:{stage}") == 1, (
                rid,
                kind,
                stage,
                {k: v for k, v in counts.items() if k.startswith(rid)},
                holders.get(rid),
                [(e.seq, e.type, e.stage, e.data) for e in sink.for_run(rid)],
            )
        enters = counts.get(f"{rid}:b:enter", 0)
        if kind == "plain":
            assert enters == 1
        else:
            assert counts.get(f"{rid}:x") == 1, (rid, kind)
            assert 1 <= enters <= 2  # a resumed stage re-enters its body (step x replays)
        events = sink.for_run(rid)
        assert [e.type for e in events].count("run.migrated") <= 1
        graph = wfs[kind].graph()
        trace = normalise(events, graph)  # one gap-free sequence, however the run moved
        assert trace[-2:] == [
            ["business", "a.done", "a", {"n": trace[-2][3]["n"]}],
            ["run.completed"],
        ]
    elapsed = time.monotonic() - t0
    print(f"{N_RUNS} runs, {moved} moved, {elapsed:.1f}s")
