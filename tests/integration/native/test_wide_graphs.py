"""Big graphs at run time (issue 12): the work of one stage transition does not grow with the
width of the graph, a stage is handed only the outputs it may read (its upstream), and a very
wide graph completes."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy import event
from sqlalchemy.engine import cursor as sa_cursor

from driver_native import (
    CancelRun,
    ClaimPending,
    CreateRun,
    ExecuteJob,
    NativeEngine,
    _migration,
    _progress,
    _rawsql,
    _schema,
)
from driver_native._db import Database, _WriterBusy
from engine_port import Retry, StageContext, Workflow

from .conftest import MakeEngine


class Empty(BaseModel):
    """The input of this module's workflows."""


def fan(width: int) -> Workflow[Any]:
    """src -> m0..m{width-1} -> sink: each middle stage reads src, the sink reads them all
    (and src, which it comes after transitively)."""
    wf: Workflow[Any] = Workflow(f"it-fan-{width}", input=Empty)

    @wf.stage(id="src")
    async def src(ctx: StageContext[Empty]) -> int:
        return 1

    middles = []
    for i in range(width):

        async def middle(ctx: StageContext[Empty]) -> int:
            return int(ctx.output_of("src")) + 1

        middle.__name__ = f"m{i}"
        middles.append(wf.stage(id=f"m{i}", after=[src])(middle))

    @wf.stage(id="sink", after=middles)
    async def sink(ctx: StageContext[Empty]) -> int:
        return sum(int(ctx.output_of(m)) for m in middles) + int(ctx.output_of("src"))

    return wf


class Work:
    """Statements executed and rows read per write transaction, by the name of its function,
    in call order (rows: those the database returned to the kernel)."""

    def __init__(self) -> None:
        self.per_call: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.statements = 0
        self.rows = 0

    def reset(self) -> None:
        self.per_call.clear()


def _count_rows(monkeypatch: pytest.MonkeyPatch, seen: Work) -> None:
    """Count the rows every SQLAlchemy fetch hands out (one-row, many-row, buffered), and
    those of the statements run on the DBAPI cursor."""
    for cls in (
        sa_cursor.CursorFetchStrategy,
        sa_cursor.BufferedRowCursorFetchStrategy,
        sa_cursor.FullyBufferedCursorFetchStrategy,
    ):
        for name in ("fetchone", "fetchmany", "fetchall"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, _counted(vars(cls)[name], seen))
    # and the hot-path statements run on the DBAPI cursor (driver_native._rawsql)
    monkeypatch.setattr(_rawsql, "fetched", _counted(_rawsql.fetched, seen))


def _counted(fetch: Any, seen: Work) -> Any:
    def wrapped(self: Any, *a: Any, **k: Any) -> Any:
        got = fetch(self, *a, **k)
        if isinstance(got, list):
            seen.rows += len(got)
        elif got is not None:
            seen.rows += 1
        return got

    return wrapped


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    seen = Work()
    original = Database._tx_once

    def counting(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        before: tuple[int, int] | None = (seen.statements, seen.rows)
        try:
            return original(self, attempt, fn, *a, **k)
        except _WriterBusy:
            # (SQLite: a WAL checkpoint on the database thread held the writer lock; nothing
            # ran here, the transaction goes to that thread)
            before = None
            raise
        finally:
            if before is not None:
                cost = (seen.statements - before[0], seen.rows - before[1])
                seen.per_call[getattr(fn, "__name__", repr(fn))].append(cost)

    monkeypatch.setattr(Database, "_tx_once", counting)
    _count_rows(monkeypatch, seen)
    yield seen


async def _drive(engine: NativeEngine, wf: Workflow[Any], handoff: int) -> Any:
    """Run one run to its end with a kernel driven step by step (one job at a time, as a
    worker does, handing jobs on when ``handoff``): the same statements every time."""
    kernel = engine.kernel
    run_id, _ = await kernel.dispatch(CreateRun(wf.id, {}))
    handed: list[tuple[Any, Any]] = []
    while True:
        if handed:
            job, begun = handed.pop(0)
        else:
            claimed = await kernel.dispatch(ClaimPending("w1", limit=1))
            if not claimed:
                break
            job, begun = claimed[0], None
        await kernel.dispatch(
            ExecuteJob(job, "w1", handoff=handoff, on_handoff=handed.extend, begun=begun)
        )
    return await engine.get_run(run_id)


async def _profile(
    make_engine: MakeEngine, work: Work, width: int, handoff: int
) -> tuple[dict[str, list[tuple[int, int]]], Any]:
    wf = fan(width)
    engine = await make_engine(wf)

    def stmt(*_a: Any) -> None:
        work.statements += 1

    event.listen(engine.kernel.db.engine, "before_cursor_execute", stmt)
    work.reset()
    info = await _drive(engine, wf, handoff)
    event.remove(engine.kernel.db.engine, "before_cursor_execute", stmt)
    calls = dict(work.per_call)
    assert len(calls["_apply_and_read"]) == width + 2
    return calls, info


def _typical(costs: list[tuple[int, int]]) -> tuple[int, int]:
    return Counter(costs).most_common(1)[0][0]


@pytest.mark.parametrize("handoff", [0, 2])
async def test_work_per_transition_does_not_grow_with_the_width(
    make_engine: MakeEngine, work: Work, handoff: int
) -> None:
    narrow, narrow_info = await _profile(make_engine, work, 10, handoff)
    wide, wide_info = await _profile(make_engine, work, 100, handoff)
    assert narrow_info.status == wide_info.status == "completed"
    assert (narrow_info.output, wide_info.output) == (10 * 2 + 1, 100 * 2 + 1)
    for name in ("_apply_and_read", "begin_attempt", "claim"):
        if name in narrow or name in wide:
            # a stage's transition beside 99 open siblings costs what it costs beside 9:
            # the same statements, the same rows (before: every outcome and begin read every
            # stage row and output of the run, and the run's status counted all its jobs)
            assert _typical(wide[name]) == _typical(narrow[name]), (name, narrow, wide)
    # no kind of transaction needs more statements in the wide run (only a few, the ones
    # that enqueue a group or gather the fan-in, read rows in proportion to it)
    assert {k: {s for s, _ in v} for k, v in wide.items()} == {
        k: {s for s, _ in v} for k, v in narrow.items()
    }
    # in all, linear in the stages: rows read per stage no more than in the narrow run
    rows = {
        w: sum(r for v in calls.values() for _, r in v) for w, calls in ((10, narrow), (100, wide))
    }
    assert rows[100] / 100 <= rows[10] / 10, rows


async def test_a_stage_gets_only_its_upstream_outputs(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    begins: dict[str, set[str]] = {}
    original = _progress.begin_attempt

    def recording(*a: Any, **k: Any) -> Any:
        begin, drafts = original(*a, **k)
        if begin is not None:
            begins[begin.stage_id] = set(begin.outputs)
        return begin, drafts

    monkeypatch.setattr(_progress, "begin_attempt", recording)
    wf = fan(20)
    engine = await make_engine(wf)
    info = await _drive(engine, wf, handoff=0)
    assert info.status == "completed" and info.output == 41
    assert begins["src"] == set()
    assert {begins[f"m{i}"] == {"src"} for i in range(20)} == {True}  # not its siblings'
    assert begins["sink"] == {"src"} | {f"m{i}" for i in range(20)}


def _side_read() -> Workflow[Any]:
    wf: Workflow[Any] = Workflow("it-side-read", input=Empty)

    @wf.stage(id="x")
    async def x(ctx: StageContext[Empty]) -> int:
        return 1

    @wf.stage(id="y")
    async def y(ctx: StageContext[Empty]) -> int:
        return 2

    @wf.stage(id="z", after=[x])
    async def z(ctx: StageContext[Empty]) -> int:
        return int(ctx.output_of("y"))  # y finished before z starts, but z is not after it

    return wf


async def test_reading_a_stage_that_is_not_upstream_fails_as_on_temporal(
    make_engine: MakeEngine,
) -> None:
    wf = _side_read()
    engine = await make_engine(wf)
    info = await _drive(engine, wf, handoff=0)
    assert info.status == "failed"
    assert info.error is not None and "only completed upstream stages" in info.error.message


WIDE = 2_000


async def test_a_two_thousand_stage_wide_graph_completes(make_engine: MakeEngine) -> None:
    wf = fan(WIDE)
    engine = await make_engine(wf)
    async with engine.worker(concurrency=16):
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=600)
    assert info.status == "completed" and info.output == WIDE * 2 + 1


async def _group_open(engine: NativeEngine, run_id: str) -> Any:
    return await engine.kernel.db.read(
        lambda c: c.execute(
            sa.select(_schema.runs.c.group_open).where(_schema.runs.c.id == run_id)
        ).scalar_one()
    )


async def test_a_run_from_before_v9_counts_its_open_stages_at_its_next_transition(
    make_engine: MakeEngine,
) -> None:
    """Runs that existed before schema v9 have no count of their group's open stages (NULL):
    their next transition counts it, and the run goes on as before."""
    wf = fan(5)
    engine = await make_engine(wf)
    kernel = engine.kernel
    run_id, _ = await kernel.dispatch(CreateRun(wf.id, {}))
    for _ in range(3):  # src, then two of the five middle stages
        (job,) = await kernel.dispatch(ClaimPending("w1", limit=1))
        assert await kernel.dispatch(ExecuteJob(job, "w1")) == "completed"
    assert await _group_open(engine, run_id) == 3
    await kernel.db.tx(
        lambda c: c.execute(
            sa.update(_schema.runs).where(_schema.runs.c.id == run_id).values(group_open=None)
        )
    )
    (job,) = await kernel.dispatch(ClaimPending("w1", limit=1))
    assert await kernel.dispatch(ExecuteJob(job, "w1")) == "completed"
    assert await _group_open(engine, run_id) == 2  # counted again, without this one
    info = await _drive(engine, wf, handoff=0)  # (drives the rest: a second run too)
    assert info.status == "completed"
    run = await engine.get_run(run_id)
    assert run.status == "completed" and run.output == 5 * 2 + 1


def test_v9_adds_the_open_stage_count_and_indexes_jobs_by_run_and_status(
    database_url: str,
) -> None:
    db = Database(database_url)
    try:
        db.upgrade()

        def back_to_v8(c: sa.Connection) -> None:  # what a v8 database has
            c.execute(sa.text("DROP INDEX ix_wfe_jobs_run_status"))
            c.execute(sa.text("CREATE INDEX ix_wfe_jobs_run ON wfe_jobs (run_id)"))
            c.execute(sa.text("ALTER TABLE wfe_runs DROP COLUMN group_open"))
            c.execute(sa.update(_schema.schema_info).values(version=8))

        db.tx_sync(back_to_v8)
        assert db.upgrade() == [v for v, _, _ in _schema.MIGRATIONS if v > 8]  # 9 first

        def shape(c: sa.Connection) -> tuple[set[str], set[str]]:
            insp = sa.inspect(c)
            columns = {col["name"] for col in insp.get_columns("wfe_runs")}
            return columns, {str(i["name"]) for i in insp.get_indexes("wfe_jobs")}

        columns, indexes = db.tx_sync(shape)
        assert "group_open" in columns
        assert "ix_wfe_jobs_run_status" in indexes and "ix_wfe_jobs_run" not in indexes
    finally:
        db.dispose()


def _chain3() -> Workflow[Any]:
    wf: Workflow[Any] = Workflow("it-chain-3", input=Empty)

    @wf.stage(id="a")
    async def a(ctx: StageContext[Empty]) -> int:
        return 1

    @wf.stage(id="b", after=[a])
    async def b(ctx: StageContext[Empty]) -> int:
        return int(ctx.output_of("a")) + 1

    @wf.stage(id="c", after=[b])
    async def c(ctx: StageContext[Empty]) -> int:
        return int(ctx.output_of("b")) + 1

    return wf


# Statements (BEGIN IMMEDIATE included on SQLite) per write transaction of a 3-stage run,
# each next stage handed to the worker that completed the one before (issue 12: creating
# the run took 9 before it stopped reading back the stage rows it had just inserted; on
# SQLite 8 until the run's row was inserted as the schedule leaves it, its first events
# numbered from 1: no update of the row for their numbers, test_create_row_once).
CHAIN3_STATEMENTS = {
    "sqlite": {
        "_create_run_once": [7],
        "claim": [2],
        "begin_attempt": [6],
        "_apply_and_read": [10, 10, 9],
    },
    "postgresql": {
        "_create_run_once": [8],
        "claim": [1],
        "begin_attempt": [5],
        # (10, 10, 8 until each outcome was predicted from its begin: the first reads,
        # the job ids it reserves ahead 32 at a time among its reads (11); the others send
        # two guards before their writes instead of their reads)
        "_apply_and_read": [11, 8, 6],
    },
}


async def test_statements_of_a_three_stage_run_are_pinned(
    make_engine: MakeEngine, work: Work
) -> None:
    wf = _chain3()
    engine = await make_engine(wf)

    def stmt(*_a: Any) -> None:
        work.statements += 1

    event.listen(engine.kernel.db.engine, "before_cursor_execute", stmt)
    work.reset()
    info = await _drive(engine, wf, handoff=1)
    event.remove(engine.kernel.db.engine, "before_cursor_execute", stmt)
    assert info.status == "completed" and info.output == 3
    got = {k: [s for s, _ in v] for k, v in work.per_call.items()}
    assert got == CHAIN3_STATEMENTS[engine.kernel.db.engine.dialect.name], got


# PostgreSQL network round trips (BEGIN and COMMIT included) per write transaction of the
# same run: the reads a stage completion needs go out in its first pipeline (the run row, its
# stage, the next group's rows and job ids for them, at the end the staged events), its
# writes with the COMMIT (4 each before: the next group's read and the job insert).
CHAIN3_ROUND_TRIPS = {
    # (3 before its jobs were no longer read back; 2 before it stopped reading the drain
    # first: the drain is checked by its first statement, sent with the writes)
    "_create_run_once": [1],
    "claim": [2],
    "begin_attempt": [2],
    # (2, 2, 2 before each outcome was predicted from its begin: the first still reads, its
    # job ids ahead with its reads, and the others are guards, writes and COMMIT in one)
    "_apply_and_read": [2, 1, 1],
}


async def test_round_trips_of_a_three_stage_run_are_pinned(
    make_engine: MakeEngine, round_trips: dict[str, list[int]]
) -> None:
    wf = _chain3()
    engine = await make_engine(wf)
    if not engine.kernel.db.is_postgres:
        pytest.skip("SQLite has no network round trips")
    round_trips.clear()
    info = await _drive(engine, wf, handoff=1)
    assert info.status == "completed" and info.output == 3
    assert dict(round_trips) == CHAIN3_ROUND_TRIPS, dict(round_trips)


async def test_the_statements_of_a_run_are_not_planned_anew_at_every_execution(
    make_engine: MakeEngine,
) -> None:
    # PostgreSQL plans a prepared statement for its values five times, then keeps one plan
    # for all values unless that plan looks costlier. The job ids reserved ahead were read
    # over ``generate_series(1, $n)``, whose one plan has to assume 1,000 rows: the server
    # planned that read anew at each of its executions (~0.1 ms of its CPU, three per run).
    wf = _chain3()
    engine = await make_engine(wf)
    if not engine.kernel.db.is_postgres:
        pytest.skip("SQLite plans no prepared statements")
    for _ in range(12):
        assert (await _drive(engine, wf, handoff=1)).status == "completed"

    def plans(conn: sa.Connection) -> list[tuple[str, int, int]]:
        query = "SELECT name, statement, generic_plans, custom_plans FROM pg_prepared_statements"
        out = []
        for name, text, generic, custom in conn.execute(sa.text(query)).all():
            # (``statement`` is the whole query text the PREPARE came in: its own part)
            own = next(p for p in text.split("\n;\n") if p.startswith(f"PREPARE {name} AS"))
            out.append((own, generic, custom))
        return out

    seen = await engine.kernel.db.tx(plans)
    # (the session of the run's transactions: its outcomes' guards are there, predicted from
    # their begins; job ids are reserved ahead, 32 at a time, by the outcomes that read)
    assert any("FOR SHARE" in sql and generic + custom >= 12 for sql, generic, custom in seen)
    replanned = [(sql, custom) for sql, generic, custom in seen if generic == 0 and custom >= 10]
    assert not replanned, replanned


async def test_a_sibling_outcome_in_a_fan_out_takes_two_round_trips(
    make_engine: MakeEngine, round_trips: dict[str, list[int]]
) -> None:
    # A middle stage that completes while its siblings are still open leaves the run's
    # status to the database (running while a job is busy, suspended when all wait): a
    # write sent with the COMMIT. It was a read of the run's jobs with a round trip of its
    # own (3 per sibling outcome, 2 after this).
    wf = fan(6)
    engine = await make_engine(wf)
    if not engine.kernel.db.is_postgres:
        pytest.skip("SQLite has no network round trips")
    round_trips.clear()
    info = await _drive(engine, wf, handoff=0)
    assert info.status == "completed"
    outcomes = round_trips["_apply_and_read"]
    assert len(outcomes) == 8  # src, the 6 middles, the sink
    assert outcomes[1:6] == [2] * 5, outcomes  # (the last middle schedules the sink)


def _roots(n: int) -> Workflow[Any]:
    """n stages with no upstream (the first group), then a join. ``r0``'s first attempt
    fails, its retry a minute later."""
    wf: Workflow[Any] = Workflow(f"it-roots-{n}", input=Empty)
    roots = []
    for i in range(n):

        async def root(ctx: StageContext[Empty]) -> int:
            if ctx.stage_id == "r0" and ctx.attempt == 1:
                raise RuntimeError("once")
            return 1

        root.__name__ = f"r{i}"
        retry = Retry(max_attempts=2, initial_interval=timedelta(minutes=1))
        roots.append(wf.stage(id=f"r{i}", retry=retry)(root))

    @wf.stage(id="join", after=roots)
    async def join(ctx: StageContext[Empty]) -> int:
        return sum(int(ctx.output_of(r)) for r in roots)

    return wf


async def test_creating_a_run_writes_each_stage_row_once_in_one_statement(
    make_engine: MakeEngine,
) -> None:
    # A run created with its first stages handed to a local worker: their rows are inserted
    # running (attempt 1), not inserted pending and then updated; on PostgreSQL all the
    # stage rows go in one statement (one EXECUTE per row before: 6 here, and an UPDATE).
    wf = _roots(5)
    engine = await make_engine(wf)
    kernel = engine.kernel
    sent: list[tuple[str, bool]] = []

    def stmt(_c: Any, _cur: Any, statement: str, _p: Any, _ctx: Any, many: bool) -> None:
        sent.append((" ".join(statement.split()), many))

    handoff = _progress.Handoff("w1", 30.0, 2)
    event.listen(kernel.db.engine, "before_cursor_execute", stmt)
    try:
        run_id, _ = await kernel.dispatch(CreateRun(wf.id, {}, handoff=handoff))
    finally:
        event.remove(kernel.db.engine, "before_cursor_execute", stmt)
    stage_writes = [(s, m) for s, m in sent if "wfe_stages" in s.split(" (")[0]]
    assert [s.split(" (")[0] for s, _ in stage_writes] == ["INSERT INTO wfe_stages"], sent
    if kernel.db.is_postgres:
        assert not stage_writes[0][1], "one statement, not one execution per row"
    assert sorted(job.stage_id for job, _ in handoff.jobs) == ["r0", "r1"]

    rows = await kernel.db.read(
        lambda conn: conn.execute(
            sa.select(_schema.stages).where(_schema.stages.c.run_id == run_id)
        ).all()
    )
    by_id = {r.stage_id: r for r in rows}
    assert sorted(by_id) == ["join", "r0", "r1", "r2", "r3", "r4"]
    for sid, r in by_id.items():
        running = sid in ("r0", "r1")
        assert (r.status, r.attempt, r.suspensions, r.has_output) == (
            ("running", 1, 0, False) if running else ("pending", 0, 0, False)
        ), sid
        assert (r.started_at is not None) == running, sid
        assert (r.error, r.waiting_for, r.wake_at, r.finished_at) == (None, None, None, None)

    # the handed stages run on from there; the others through the queue
    for job, begun in handoff.jobs:
        await kernel.dispatch(ExecuteJob(job, "w1", begun=begun))
    while claimed := await kernel.dispatch(ClaimPending("w1", limit=1)):
        await kernel.dispatch(ExecuteJob(claimed[0], "w1"))
    info = await engine.get_run(run_id)
    assert info.status == "running" and info.stages[0].status == "pending"  # r0's retry
    assert [s.status for s in info.stages[1:]] == ["completed"] * 4 + ["pending"]


@contextlib.contextmanager
def _statements(engine: NativeEngine) -> Iterator[list[str]]:
    """The statements the engine's database is sent inside the block."""
    sent: list[str] = []

    def stmt(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        sent.append(statement)

    event.listen(engine.kernel.db.engine, "before_cursor_execute", stmt)
    try:
        yield sent
    finally:
        event.remove(engine.kernel.db.engine, "before_cursor_execute", stmt)


async def _same_statements(
    make_engine: MakeEngine, scenario: Any, widths: tuple[int, ...]
) -> list[tuple[Any, ...]]:
    """``scenario(make_engine, width)`` (-> statements counted, then what it found) for each
    width: the counts are the same; returns what each found."""
    got = [await scenario(make_engine, width) for width in widths]
    counts = [g[0] for g in got]
    assert len(set(counts)) == 1, dict(zip(widths, counts, strict=True))
    return [g[1:] for g in got]


async def _cancelled(make_engine: MakeEngine, width: int) -> tuple[int, Any, list[Any]]:
    """A run of ``_roots(width)`` whose ``r0`` failed once and waits for its retry, the
    other roots queued; cancelled: the statements of the cancel, the run, its events."""
    wf = _roots(width)
    engine = await make_engine(wf)
    kernel = engine.kernel
    run_id, _ = await kernel.dispatch(CreateRun(wf.id, {}))
    claimed = await kernel.dispatch(ClaimPending("w1", limit=1))
    assert claimed[0].stage_id == "r0"
    await kernel.dispatch(ExecuteJob(claimed[0], "w1"))
    with _statements(engine) as sent:  # (the cancel's own transaction: no worker ends it)
        await kernel.dispatch(CancelRun(run_id))
    return len(sent), await engine.get_run(run_id), await engine.events(run_id)


async def test_cancelling_a_wide_run_takes_the_same_statements_whatever_its_queue(
    make_engine: MakeEngine,
) -> None:
    # Stopping a run's stages (cancel, or a stage failing for good) read each queued job's
    # stage and deleted the job one statement at a time: 2,000 queued stages took 1.1 s on
    # PostgreSQL (two round trips each), in one transaction holding the run's lock.
    for got, evs in await _same_statements(make_engine, _cancelled, (5, 60)):
        assert got.stages[0].status == "cancelled"  # it had started: attempt 1 failed
        assert {s.status for s in got.stages[1:]} == {"pending"}, got.stages  # never started
        assert [e.stage for e in evs if e.type == "stage.cancelled"] == ["r0"]


async def _redriven(make_engine: MakeEngine, width: int) -> tuple[int, Any, Any]:
    """A completed run of ``fan(width)`` (its journal kept nothing), redriven from the start:
    the statements of the redrive, the run once it completed again, its archived stages."""
    wf = fan(width)
    engine = await make_engine(wf)
    kernel = engine.kernel
    info = await _drive(engine, wf, handoff=1)
    assert info.status == "completed"
    with _statements(engine) as sent:
        await engine.redrive(info.id, "start")
    while claimed := await kernel.dispatch(ClaimPending("w1", limit=1)):
        await kernel.dispatch(ExecuteJob(claimed[0], "w1"))
    archive = _schema.stage_archive
    archived = await kernel.db.read(
        lambda conn: conn.execute(
            sa.select(archive.c.stage_id, archive.c.redrive, archive.c.record).where(
                archive.c.run_id == info.id
            )
        ).all()
    )
    return len(sent), await engine.get_run(info.id), archived


async def test_redriving_a_wide_run_takes_the_same_statements_whatever_its_width(
    make_engine: MakeEngine,
) -> None:
    # A redrive archived each stage and cleared its journal one statement at a time (two
    # round trips a stage on PostgreSQL: 2,000 stages 1.7 s, 0.45 s after).
    runs = await _same_statements(make_engine, _redriven, (3, 40))
    for (got, rows), width in zip(runs, (3, 40), strict=True):
        assert got.status == "completed" and got.redrive_count == 1
        assert got.output == width * 2 + 1
        assert sorted(r.stage_id for r in rows) == sorted(s.id for s in got.stages)
        assert {(r.redrive, r.record["status"], r.record["attempt"]) for r in rows} == {
            (0, "completed", 1)
        }


def _waiters(n: int) -> Workflow[Any]:
    """``w0..w{n-1}``, each journaling a step and emitting an event before it waits for its
    own signal ``go-wI``, ``flaky`` whose first attempt fails (its retry a minute later), and
    a join that waits for the signal ``early`` and returns it."""
    wf: Workflow[Any] = Workflow(f"it-waiters-{n}", input=Empty)
    waiting = []
    for i in range(n):

        async def waiter(ctx: StageContext[Empty]) -> Any:
            await ctx.step.run("prep", lambda: 1)
            ctx.emit("it.prepared", {"stage": ctx.stage_id})
            return await ctx.step.wait_for_signal(f"go-{ctx.stage_id}")

        waiter.__name__ = f"w{i}"
        waiting.append(wf.stage(id=f"w{i}")(waiter))

    @wf.stage(id="flaky", retry=Retry(max_attempts=2, initial_interval=timedelta(minutes=1)))
    async def flaky(ctx: StageContext[Empty]) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("once")
        return 1

    @wf.stage(id="join", after=[*waiting, flaky])
    async def join(ctx: StageContext[Empty]) -> Any:
        return await ctx.step.wait_for_signal("early")

    return wf


async def _run_due(engine: NativeEngine) -> None:
    while claimed := await engine.kernel.dispatch(ClaimPending("w1", limit=1)):
        await engine.kernel.dispatch(ExecuteJob(claimed[0], "w1"))


async def _imported(make_engine: MakeEngine, width: int) -> tuple[int, Any, Any, list[Any]]:
    """A run of ``_waiters(width)`` exported with every kind of row a snapshot carries (a
    completed stage, suspended ones with a journal and staged events, one between attempts,
    a queued signal and a consumed one's key), imported again under another id: the
    statements of the import, the source and the copy once it completed, the copy's events."""
    wf = _waiters(width)
    engine = await make_engine(wf)
    run_id, _ = await engine.kernel.dispatch(CreateRun(wf.id, {}))
    await _run_due(engine)
    await engine.signal(run_id, "go-w0", "zero", idempotency_key="k0")
    await _run_due(engine)
    await engine.signal(run_id, "early", "first", idempotency_key="k1")
    snapshot = await engine.export_run(run_id)
    assert {s.status for s in snapshot.stages} == {"completed", "suspended", "pending"}
    copy = snapshot.model_copy(update={"run_id": f"{run_id}-copy"})
    with _statements(engine) as sent:
        await engine.import_run(copy)
    source = await engine.get_run(run_id)
    await engine.signal(copy.run_id, "go-w0", "again", idempotency_key="k0")  # consumed there
    for i in range(1, width):
        await engine.signal(copy.run_id, f"go-w{i}", i)
    await _run_due(engine)
    return len(sent), source, await engine.get_run(copy.run_id), await engine.events(copy.run_id)


async def test_importing_a_wide_run_takes_the_same_statements_whatever_its_width(
    make_engine: MakeEngine,
) -> None:
    # Importing a migrated run wrote its stages, steps, staged events, jobs and signals one
    # statement each (a round trip each on PostgreSQL).
    runs = await _same_statements(make_engine, _imported, (3, 40))
    for (source, got, events), width in zip(runs, (3, 40), strict=True):
        assert source.status == "running"
        assert got.status == "completed", got
        assert got.output == "first"  # the signal queued at the source
        assert [got.stage(f"w{i}").output for i in range(width)] == ["zero", *range(1, width)]
        assert got.stage("flaky").attempt == 2
        prepared = sorted(e.data["stage"] for e in events if e.type == "it.prepared")
        assert prepared == sorted(f"w{i}" for i in range(width))


def _lines_in(module: Any, fn: Any) -> tuple[Any, list[int]]:
    """``fn`` wrapped to count the lines of ``module`` it executes (in the thread it runs in:
    the database's), and the count: a measure of work that a loaded machine cannot skew."""
    count = [0]
    path = module.__file__

    def local(frame: Any, what: str, _arg: Any) -> Any:
        if what == "line":
            count[0] += 1
        return local

    def tracer(frame: Any, _what: str, _arg: Any) -> Any:
        return local if frame.f_code.co_filename == path else None

    def traced(*args: Any) -> Any:
        before = sys.gettrace()
        sys.settrace(tracer)
        try:
            return fn(*args)
        finally:
            sys.settrace(before)

    return traced, count


async def _export_lines(make_engine: MakeEngine, width: int) -> int:
    """The lines of ``_migration`` run to export a run of ``_waiters(width)`` whose odd
    stages completed (their events staged until the group ends) and even ones wait with a
    journal."""
    wf = _waiters(width)
    engine = await make_engine(wf)
    run_id, _ = await engine.kernel.dispatch(CreateRun(wf.id, {}))
    await _run_due(engine)
    for i in range(1, width, 2):
        await engine.signal(run_id, f"go-w{i}", i)
    await _run_due(engine)
    traced, lines = _lines_in(_migration, _migration.freeze_and_snapshot)
    snapshot = await engine.kernel.db.tx(traced, run_id)
    waiting = {s.id: (len(s.steps), len(s.staged_events)) for s in snapshot.stages}
    assert waiting == {
        "flaky": (0, 0),
        "join": (0, 0),
        **{f"w{i}": (2, 0) if i % 2 == 0 else (2, 1) for i in range(width)},
    }
    return lines[0]


async def test_exporting_a_run_does_the_same_work_per_stage_whatever_its_width(
    make_engine: MakeEngine,
) -> None:
    # Exporting a run matched every stage against every journal entry and staged event of the
    # run: 2,000 suspended stages took 7-10 s, holding the run's lock (and SQLite's writer).
    lines = [await _export_lines(make_engine, width) for width in (4, 8, 16)]
    assert lines[2] - lines[1] == 2 * (lines[1] - lines[0]), lines
