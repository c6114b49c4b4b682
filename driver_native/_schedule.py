"""What runs next: enqueue a run's next group, hand its first stages to a worker, finish it.

A transition reads only the rows it needs: the stages of the group it schedules, the outputs
the stages it hands off may read (their upstream, as the graph declares it) and, at the end,
the sinks' outputs. The run row counts the current group's open stages (``group_open``), so a
stage completing beside others still open needs no read at all (``apply_outcome``).

Every function here runs inside one transaction that the kernel opened; none runs user code.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import Collection
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from engine_port import EventDraft, GraphModel, Lifecycle, RunStatus, StageStatus, run_output
from engine_port.driver import version_key

from ._jobs import notify_due
from ._rawsql import execute
from ._schema import jobs, runs, staged_events, stages, steps
from ._shape import GraphShape
from ._sql import db_clock, db_clock_sql, delete_later, in_binds, in_params, update_later

__all__ = [
    "JOBS_CHUNK",
    "Ahead",
    "Begin",
    "Handoff",
    "attempt_started",
    "fresh_rows",
    "lc",
    "outputs_reads",
    "reserve_ids",
    "reserved",
    "schedule",
    "touch",
    "upstream_outputs",
]

Reserved = list[tuple[int, float | None]]
"""Job ids reserved ahead (PostgreSQL), each with the database clock when they were (None:
the insert reads it, see :func:`_insert_reserved`)."""

IN_CHUNK = 1000
"""Stage ids per ``IN (...)`` list: far below SQLite's and PostgreSQL's parameter limits."""


@dataclass(frozen=True)
class Begin:
    """What job.execute needs to run one stage attempt outside the transaction."""

    run_id: str
    workflow_id: str
    version: str
    stage_id: str
    attempt: int
    input: Any
    outputs: dict[str, Any]  # upstream stage id -> stored output (maybe a spill reference)
    steps: list[Any] = field(default_factory=list)
    trace_context: str | None = None
    fresh: bool = False
    """The attempt begins now (``stage.started``: a first attempt, a retry, a redrive), as
    opposed to one resumed after a wait or a crash: journaled ``steps`` then come from an
    earlier attempt, and its log says "stage started", not "stage resumed"."""
    seen: Any = field(default=None, compare=False, repr=False)
    """What the transaction that began the attempt knew of the run: the run row it read (or
    made) and the values it wrote to it (a dict, complete once that transaction ended). The
    outcome's transaction predicts its reads from it (``_progress.apply_outcome``)."""


@dataclass
class Handoff:
    """Jobs a transition enqueues may be leased at once to the worker that made it (up to
    ``limit``), so it runs the next stage without a round trip through the queue."""

    worker: str
    lease: float
    limit: int
    jobs: list[tuple[Any, Begin]] = field(default_factory=list)  # already marked running
    # the transition left nothing for the queue: it finished the run, or every job it
    # enqueued is in ``jobs`` (the host need not look for work)
    quiet: bool = False
    finished: bool = False  # the transition ended the run (completed)
    # job ids this transaction reserved ahead (PostgreSQL), each with the database clock when
    # it did (None: ids reserved by an earlier transaction, the insert reads the clock): jobs
    # handed with them are inserted with the COMMIT, not read back (``Ahead``)
    reserved: Reserved = field(default_factory=list)
    # the job of the transition is due again at this time in the future (the kernel's clock,
    # epoch seconds): a suspension with a deadline (a sleep, a wait's timeout), a retry after
    # its delay. None: it is not (due now, or waiting for a signal, or gone). The worker sets
    # a timer for it, so that it resumes on time rather than at its next poll
    due_at: float | None = None


@dataclass
class Ahead:
    """What a stage completion reads in its first round trip on PostgreSQL (with the run row
    and its own stage), in case it closes its group: the stage rows scheduling reads next and,
    in the last group, the run's staged events. The reads ask the run row themselves and come
    back empty unless this completion closes the group (``group_open`` is 1), so a sibling in
    a wide group pays nothing for them."""

    ids: list[str]
    staged: bool  # the run's staged events are read too (the last group)
    reserve: int = 0  # job ids to reserve for the next group (see ``Handoff.reserved``)
    rows: dict[str, Any] = field(default_factory=dict)
    staged_rows: list[Any] = field(default_factory=list)
    reserved: Reserved = field(default_factory=list)

    @classmethod
    def plan(cls, shape: GraphShape, stage_id: str, handoff: Handoff | None) -> Ahead | None:
        """The reads for a completion of ``stage_id`` (None: too many rows to read ahead)."""
        group = shape.group_of(stage_id)
        if group is None:
            return None
        want = _wanted(shape, group, handoff)
        last = group + 1 == len(shape.groups)
        if not last:
            want |= _wanted(shape, group + 1, handoff)
        if len(want) > IN_CHUNK:
            return None
        reserve = 0
        if not last and handoff is not None and handoff.limit > 0:
            reserve = min(len(shape.groups[group + 1]), JOBS_CHUNK)
        return cls(sorted(want), last, reserve)

    def calls(self, run_id: str) -> list[tuple[Any, dict[str, Any]]]:
        """The statements (and parameters) of the reads, for ``execute_together``."""
        calls = [(_rows_query(len(self.ids), True), {"run_id": run_id} | in_params(self.ids))]
        if self.staged:
            calls.append((_staged_query(True), {"run_id": run_id}))
        if self.reserve:
            n = self.reserve
            calls.append((_reserve_query(True, n == 1), {"run_id": run_id, "n": n}))
        return calls

    def took(self, results: list[Any]) -> None:
        """Keep what :meth:`calls` returned."""
        self.rows = {r.stage_id: r for r in results[0]}
        if self.staged:
            self.staged_rows = list(results[1])
        if self.reserve:
            self.reserved = reserved(results[-1])


@functools.cache
def _reserve_query(closing: bool = True, one: bool = False) -> Any:
    """PostgreSQL: ``n`` fresh job ids and the database clock (``closing``: only if the run's
    current group has one open stage left; nothing is taken from the sequence otherwise).

    ``one``: the commonest case, one id (a chain's next stage, a group's last outcome), as a
    statement of one row. Over ``generate_series(1, $n)`` the server re-plans the prepared
    statement at every execution (a generic plan would have to assume 1,000 rows, so it
    never wins against a custom plan of one): ~0.1 ms of its CPU each time."""
    sequence = sa.func.pg_get_serial_sequence(jobs.name, "id")
    query = sa.select(
        sa.func.nextval(sequence).label("id"),
        db_clock_sql().label("clock"),
    )
    if not one:
        query = query.select_from(sa.func.generate_series(1, sa.bindparam("n", type_=sa.Integer)))
    return query.where(_closing()) if closing else query


def reserve_ids(n: int) -> tuple[Any, dict[str, Any]]:
    """PostgreSQL: the read of ``n`` job ids for ``Handoff.reserved`` (for
    ``execute_together``; :func:`reserved` makes its rows the list to keep)."""
    return _reserve_query(False, n == 1), {"n": n}


def reserved(rows: Any) -> Reserved:
    return [(r.id, float(r.clock)) for r in rows]


def lc(run: Any) -> Lifecycle:
    return Lifecycle(run.id, run.redrive_count)


def touch(conn: Connection, run_id: str, now: float, **values: Any) -> None:
    update_later(conn, runs, {"id": run_id}, {"updated_at": now, **values})


def attempt_started(attempt: int, now: float) -> dict[str, Any]:
    """A stage row's values when an attempt starts (begun by a worker, or handed to one)."""
    return {
        "status": StageStatus.RUNNING,
        "attempt": attempt,
        "suspensions": 0,
        "started_at": now,
        "error": None,
        "waiting_for": None,
        "wake_at": None,
    }


def _chunks(ids: Collection[str]) -> list[list[str]]:
    ordered = sorted(ids)
    return [ordered[i : i + IN_CHUNK] for i in range(0, len(ordered), IN_CHUNK)]


def _closing() -> Any:
    """The run's current group has one open stage left (the completion reading ahead closes
    it): a condition of the reads ahead, so they cost nothing otherwise."""
    return sa.exists().where(runs.c.id == sa.bindparam("run_id"), runs.c.group_open == 1)


@functools.cache
def _rows_query(n: int, closing: bool = False) -> Any:
    """Some stages of a run: status, output, whether a stage job and a step ledger exist
    (``closing``: only if the run's current group has one open stage, see ``Ahead``)."""
    has_steps = (
        sa.exists()
        .where(steps.c.run_id == stages.c.run_id, steps.c.stage_id == stages.c.stage_id)
        .label("has_steps")
    )
    joined = stages.outerjoin(
        jobs,
        sa.and_(
            jobs.c.run_id == stages.c.run_id,
            jobs.c.stage_id == stages.c.stage_id,
            jobs.c.kind == "stage",
        ),
    )
    query = (
        sa.select(
            stages.c.stage_id,
            stages.c.status,
            stages.c.output,
            stages.c.has_output,
            jobs.c.id.label("job_id"),
            has_steps,
        )
        .select_from(joined)
        .where(stages.c.run_id == sa.bindparam("run_id"), stages.c.stage_id.in_(in_binds(n)))
    )
    return query.where(_closing()) if closing else query


def fresh_rows(ids: Collection[str]) -> dict[str, Any]:
    """The stage rows of a run just created (as ``_stage_rows`` would read them)."""
    return {
        sid: SimpleNamespace(
            stage_id=sid,
            status=StageStatus.PENDING,
            output=None,
            has_output=False,
            job_id=None,
            has_steps=False,
        )
        for sid in ids
    }


def _stage_rows(conn: Connection, run_id: str, ids: Collection[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for chunk in _chunks(ids):
        for r in execute(conn, _rows_query(len(chunk)), {"run_id": run_id} | in_params(chunk)):
            out[r.stage_id] = r
    return out


@functools.cache
def _outputs_query(n: int) -> Any:
    return sa.select(stages.c.stage_id, stages.c.output).where(
        stages.c.run_id == sa.bindparam("run_id"),
        stages.c.stage_id.in_(in_binds(n)),
        stages.c.has_output.is_(True),
    )


def outputs_reads(run_id: str, ids: Collection[str]) -> list[tuple[Any, dict[str, Any]]]:
    """The reads ``upstream_outputs`` makes for ``ids`` (for the caller's own round trip)."""
    return [(_outputs_query(len(c)), {"run_id": run_id} | in_params(c)) for c in _chunks(ids)]


def upstream_outputs(
    conn: Connection, run_id: str, ids: Collection[str], known: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The stored outputs of stages ``ids`` (those that have one): from ``known`` rows where
    given, the rest read in one query per chunk."""
    known = known or {}
    out = {sid: known[sid].output for sid in ids if sid in known and known[sid].has_output}
    missing = [sid for sid in ids if sid not in known]
    for chunk in _chunks(missing):
        for r in execute(conn, _outputs_query(len(chunk)), {"run_id": run_id} | in_params(chunk)):
            out[r.stage_id] = r.output
    return out


def _wanted(shape: GraphShape, group: int, handoff: Handoff | None) -> frozenset[str]:
    """The stage rows scheduling ``group`` reads (``GraphShape.wanted``)."""
    return shape.wanted(group, handoff.limit if handoff is not None else 0)


def schedule(
    conn: Connection,
    run: Any,
    graph: GraphModel | GraphShape,
    now: float,
    handoff: Handoff | None = None,
    run_values: dict[str, Any] | None = None,
    *,
    group_done: bool = False,
    known: dict[str, Any] | None = None,
    staged: list[Any] | None = None,
    unwritten: bool = False,
) -> list[EventDraft]:
    """Enqueue the first group with unfinished stages; finish the run when none is left.
    With ``run_values``, run-row changes are collected there for the caller's one update.
    Reads the stages of the groups it looks at (and what handed stages may read), never
    every stage of the run; ``group_done``: the caller saw the current group's last open
    stage complete, so the next group's rows are read in the same query. ``known``: stage
    rows the caller has (as ``_stage_rows`` reads them), not read again; ``staged``: the
    run's staged events, when the caller has read them; ``unwritten``: the ``known`` rows
    are not in the database yet (a run being created): stages handed off are not marked
    running here, the caller inserts their rows running (``handoff.jobs``)."""
    shape = graph if isinstance(graph, GraphShape) else GraphShape(graph)
    groups = shape.groups
    values: dict[str, Any] = run_values if run_values is not None else {}
    drafts: list[EventDraft] = []
    if handoff is not None:
        handoff.quiet = handoff.finished = False
    seen: dict[str, Any] = dict(known or {})
    group = run.current_group
    while group < len(groups):
        want = _wanted(shape, group, handoff)
        if group_done and group == run.current_group and group + 1 < len(groups):
            want |= _wanted(shape, group + 1, handoff)
        seen.update(_stage_rows(conn, run.id, want - seen.keys()))
        open_stages = [sid for sid in groups[group] if seen[sid].status != StageStatus.COMPLETED]
        if open_stages:
            drafts = _enqueue(conn, run, shape, open_stages, seen, now, handoff, values, unwritten)
            values["group_open"] = len(open_stages)
            if group != run.current_group:
                values["current_group"] = group
            break
        group += 1
    else:
        drafts = _finish_completed(conn, run, shape, seen, now, values, staged)
        if handoff is not None:
            handoff.quiet = handoff.finished = True
    if run_values is None and values:
        touch(conn, run.id, now, **values)
    return drafts


def _enqueue(
    conn: Connection,
    run: Any,
    shape: GraphShape,
    open_stages: list[str],
    rows: dict[str, Any],
    now: float,
    handoff: Handoff | None,
    values: dict[str, Any],
    unwritten: bool = False,
) -> list[EventDraft]:
    """Insert jobs for the group's open stages that have none, the first ``handoff.limit``
    of them leased to the handoff's worker and begun (``unwritten``: see ``schedule``)."""
    new = [s for s in sorted(open_stages) if rows[s].job_id is None]
    # a run being frozen for migration (``_migration.freeze_and_snapshot`` waits for its
    # running stage): the next stages' jobs wait frozen, neither handed on nor queued
    frozen = bool(getattr(run, "frozen", False))
    take = set(new[: handoff.limit]) if handoff is not None and not frozen else set()
    postgres = conn.dialect.name == "postgresql"
    lease_until = None
    if take and handoff is not None and not postgres:
        lease_until = _lease_deadline(conn, handoff.lease, now)
    drafts: list[EventDraft] = []
    if new:
        wfv = version_key(run.workflow_id, run.version)
        reserved: Reserved = []
        if handoff is not None and take and len(handoff.reserved) >= len(new):
            reserved, handoff.reserved = handoff.reserved, []
        inserted = _insert_jobs(
            conn,
            postgres,
            [
                {
                    "run_id": run.id,
                    "stage_id": s,
                    "kind": "stage",
                    "wfv": wfv,
                    "status": "leased" if s in take else "frozen" if frozen else "ready",
                    "lease_owner": handoff.worker if handoff and s in take else None,
                    "lease_token": 1 if handoff and s in take else 0,  # (its first claim)
                    # (on PostgreSQL: the database clock + "lease_for", in the insert)
                    ("lease_for" if postgres else "lease_expires_at"): (
                        (handoff.lease if postgres else lease_until)
                        if handoff and s in take
                        else None
                    ),
                    "available_at": now,
                    "attempt": 1,
                    "created_at": now,
                }
                for s in new
            ],
            reserved,
            returning=bool(take),
        )
        if len(take) < len(new) and not frozen:
            notify_due(conn)  # jobs left for the queue: wake other processes
        if take and handoff is not None:
            handed = [j for j in inserted if j.stage_id in take]
            drafts = _begin_handed(conn, run, shape, handed, handoff, rows, now, unwritten, values)
            if run.status == RunStatus.PENDING:  # handed from its creation
                drafts.insert(0, lc(run).run_started())
                values["status"] = RunStatus.RUNNING
    if handoff is not None:
        handoff.quiet = len(take) == len(new)
    return drafts


def _begin_handed(
    conn: Connection,
    run: Any,
    shape: GraphShape,
    handed: list[Any],
    handoff: Handoff,
    rows: dict[str, Any],
    now: float,
    unwritten: bool = False,
    values: dict[str, Any] | None = None,
) -> list[EventDraft]:
    """Mark freshly enqueued stages running for the worker they are handed to (their
    ``stage.started`` goes out in the same transaction as the completion that freed them;
    ``unwritten``: their rows are inserted running by the caller, nothing to update)."""
    ids = sorted(j.stage_id for j in handed)
    if not unwritten:
        started = attempt_started(1, now)
        params = {"k_run_id": run.id} | in_params(ids) | {f"v_{k}": v for k, v in started.items()}
        execute(conn, _start_stages(tuple(started), len(ids)), params, later=True)
    outputs = upstream_outputs(conn, run.id, shape.upstream(ids), rows)
    step_rows: list[Any] = []
    if any(rows[sid].has_steps for sid in ids):  # a ledger kept by a redrive
        step_rows = list(
            conn.execute(
                sa.select(steps).where(steps.c.run_id == run.id, steps.c.stage_id.in_(ids))
            ).all()
        )
    for job in sorted(handed, key=lambda j: j.stage_id):
        begin = Begin(
            run_id=run.id,
            workflow_id=run.workflow_id,
            version=run.version,
            stage_id=job.stage_id,
            attempt=1,
            input=run.input,
            outputs={a: outputs[a] for a in shape.upstream([job.stage_id]) if a in outputs},
            steps=[r for r in step_rows if r.stage_id == job.stage_id],
            trace_context=run.trace_context,
            fresh=True,
            seen=None if values is None else (run, values),
        )
        handoff.jobs.append((job, begin))
    return [lc(run).stage_started(sid, 1) for sid in ids]


JOBS_CHUNK = 200
"""Jobs per multi-row insert: 11 parameters a row, far below the databases' limits."""

_JOB_COLUMNS = ("run_id", "stage_id", "kind", "wfv", "status", "lease_owner")
_JOB_NUMBERS = ("available_at", "attempt", "created_at", "lease_token")


@functools.cache
def _jobs_insert(postgres: bool, n: int) -> Any:
    """Insert ``n`` jobs in one statement (their rows back); a handed-off job's lease runs
    from the database clock on PostgreSQL, read in the insert itself (no separate
    ``SELECT clock`` round trip)."""
    rows = []
    for i in range(n):
        row: dict[str, Any] = {c: sa.bindparam(f"{c}_{i}", type_=sa.String) for c in _JOB_COLUMNS}
        row |= {c: sa.bindparam(f"{c}_{i}", type_=jobs.c[c].type) for c in _JOB_NUMBERS}
        if postgres:
            lease_for = sa.bindparam(f"lease_for_{i}", type_=sa.Float)
            row["lease_expires_at"] = db_clock_sql() + lease_for
        else:
            row["lease_expires_at"] = sa.bindparam(f"lease_expires_at_{i}", type_=sa.Float)
        rows.append(row)
    return jobs.insert().values(rows).returning(*jobs.c)


def _insert_jobs(
    conn: Connection,
    postgres: bool,
    new: list[dict[str, Any]],
    reserved: Reserved,
    *,
    returning: bool,
) -> list[Any]:
    """Insert the jobs ``new`` (their rows back when ``returning``). With ``reserved`` ids
    (PostgreSQL, as many as ``new``) the rows are made here and the insert waits for the
    COMMIT's round trip; without ``returning`` nobody reads them, and it waits too."""
    if reserved:
        return _insert_reserved(conn, new, reserved)
    out: list[Any] = []
    for at in range(0, len(new), JOBS_CHUNK):
        chunk = new[at : at + JOBS_CHUNK]
        params = {f"{k}_{i}": v for i, row in enumerate(chunk) for k, v in row.items()}
        stmt = _jobs_insert(postgres, len(chunk))
        if returning:
            out += execute(conn, stmt, params).all()
        else:
            execute(conn, stmt, params, later=True)
    return out


@functools.cache
def _job_row() -> Any:
    """A job row made in Python, shaped as the database returns it."""
    return namedtuple("JobRow", [c.name for c in jobs.c])


def _insert_reserved(conn: Connection, new: list[dict[str, Any]], reserved: Reserved) -> list[Any]:
    """PostgreSQL: insert jobs with ids reserved ahead (a handed job's lease runs from the
    database clock read then, or read by the insert when the ids came without it), sent with
    the COMMIT; their rows are made here (a lease the insert times is given the local clock's
    expiry: the worker never reads it)."""
    make = _job_row()
    fields: tuple[str, ...] = make._fields
    out: list[Any] = []
    clocked = any(clock is None for _, clock in reserved[: len(new)])
    leases: list[float | None] = []
    for (job_id, clock), given in zip(reserved, new, strict=False):
        lease_for = given.get("lease_for")
        leases.append(lease_for)
        start = given["available_at"] if clock is None else clock
        row = given | {
            "id": job_id,
            "lease_expires_at": None if lease_for is None else start + lease_for,
        }
        out.append(make._make([row.get(f) for f in fields]))
    # (each row's values in the statement's parameter names, made once per shape: no key
    # is formatted per job)
    columns = _lease_for_columns(fields) if clocked else fields
    lease_at = fields.index("lease_expires_at")
    for at in range(0, len(out), JOBS_CHUNK):
        chunk = out[at : at + JOBS_CHUNK]
        params: dict[str, Any] = {}
        for i, job in enumerate(chunk):
            values = list(job)
            if clocked:
                values[lease_at] = leases[at + i]
            params.update(zip(_param_names(columns, i), values, strict=True))
        execute(conn, _jobs_insert_ids(len(chunk), clocked), params, later=True)
    return out


@functools.cache
def _lease_for_columns(fields: tuple[str, ...]) -> tuple[str, ...]:
    """A job row's columns as a clocked insert takes them: ``lease_for``, not its expiry."""
    return tuple("lease_for" if f == "lease_expires_at" else f for f in fields)


@functools.cache
def _param_names(columns: tuple[str, ...], i: int) -> tuple[str, ...]:
    """The parameter names of row ``i`` of a multi-row insert (``column_i``)."""
    return tuple(f"{c}_{i}" for c in columns)


@functools.cache
def _jobs_insert_ids(n: int, clocked: bool = False) -> Any:
    """Insert ``n`` jobs whose every column is given (their ids reserved ahead); ``clocked``:
    a lease expires ``lease_for`` seconds after the database's clock at the insert."""
    rows = []
    for i in range(n):
        row: dict[str, Any] = {c.name: sa.bindparam(f"{c.name}_{i}", type_=c.type) for c in jobs.c}
        if clocked:
            lease_for = sa.bindparam(f"lease_for_{i}", type_=sa.Float)
            row["lease_expires_at"] = db_clock_sql() + lease_for
        rows.append(row)
    return jobs.insert().values(rows)


@functools.cache
def _start_stages(keys: tuple[str, ...], n: int) -> Any:
    return (
        sa.update(stages)
        .where(stages.c.run_id == sa.bindparam("k_run_id"), stages.c.stage_id.in_(in_binds(n)))
        .values({k: sa.bindparam(f"v_{k}") for k in keys})
    )


def _lease_deadline(conn: Connection, lease: float, now: float) -> float:
    """A lease expiry as a number (one value for a multi-row insert)."""
    clock = db_clock(conn, now)
    if not isinstance(clock, float | int):
        clock = conn.execute(sa.select(clock)).scalar_one()
    return float(clock) + lease


@functools.cache
def _staged_query(closing: bool = False) -> Any:
    """A run's staged business events in release order (stage completion, then emit order;
    ``closing``: only if the run's current group has one open stage, see ``Ahead``)."""
    query = (
        sa.select(staged_events, stages.c.completed_order)
        .join(
            stages,
            sa.and_(
                stages.c.run_id == staged_events.c.run_id,
                stages.c.stage_id == staged_events.c.stage_id,
            ),
        )
        .where(staged_events.c.run_id == sa.bindparam("run_id"))
        .order_by(stages.c.completed_order, staged_events.c.idx)
    )
    return query.where(_closing()) if closing else query


def _finish_completed(
    conn: Connection,
    run: Any,
    shape: GraphShape,
    rows: dict[str, Any],
    now: float,
    values: dict[str, Any],
    staged: list[Any] | None = None,
) -> list[EventDraft]:
    life = lc(run)
    sinks = shape.sinks()
    outputs = upstream_outputs(conn, run.id, sinks, rows)
    if staged is None:
        staged = execute(conn, _staged_query(), {"run_id": run.id}).all()
    drafts = [life.business(r.stage_id, r.idx, r.type, r.data) for r in staged]
    drafts.append(life.run_completed())
    if staged:
        delete_later(conn, staged_events, run_id=run.id)
    values.update(
        status=RunStatus.COMPLETED,
        output=run_output(sinks, outputs),
        finished_at=now,
        updated_at=now,
        current_group=len(shape.groups),
        group_open=0,
    )
    return drafts
