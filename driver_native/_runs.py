"""Run-level transactions: create, signal, cancel, redrive, read, versions, purge, reaping."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from engine_port import (
    ErrorInfo,
    GraphModel,
    Lifecycle,
    RunStatus,
    SignalResult,
    StageStatus,
    VersionInfo,
)
from engine_port.driver import (
    REDRIVABLE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    WORKING_RUN_STATUSES,
    StepEntry,
    check_signal_known,
    frozen_run_error,
    redrive_plan,
    repin_plan,
    version_key,
)
from engine_port.errors import (
    IdempotencyConflictError,
    RunNotActiveError,
    RunNotFoundError,
    RunTimeoutError,
    SignalQueueFullError,
    WorkflowDrainedError,
)

from ._jobs import notify_due
from ._outbox import append_events, append_first_events
from ._progress import ACTIVE, Handoff, begin_compensation, refresh_status, schedule
from ._rawsql import execute, execute_many, execute_together
from ._schedule import JOBS_CHUNK, fresh_rows, reserve_ids, reserved, touch
from ._schema import (
    CASE_TWIN_WHERE,
    definitions,
    drains,
    jobs,
    outbox,
    runs,
    signals,
    stage_archive,
    staged_events,
    stages,
    steps,
)
from ._shape import GraphShape
from ._sql import lock_run, run_and, stages_of_run, try_run

__all__ = [
    "Call",
    "Signalled",
    "any_purgeable",
    "any_stuck",
    "cancel_run",
    "create_run",
    "list_steps",
    "list_versions",
    "load_graph",
    "load_graphs",
    "purge_runs",
    "purgeable",
    "read_run",
    "read_runs",
    "reap_stuck",
    "redrive_run",
    "repin_run",
    "run_status",
    "run_statuses",
    "runs_query",
    "save_definition",
    "set_drain",
    "signal_and_claim",
    "signal_run",
]

TERMINAL = TERMINAL_RUN_STATUSES
# the most rows a listing query asks for (a larger limit lists them all)
MAX_LISTED = 1_000_000_000_000_000_000


@functools.cache
def _insert_ignore(postgres: bool, table: sa.Table, keys: tuple[str, ...]) -> Any:
    ins: Any = (postgresql if postgres else sqlite).insert(table)
    return ins.values(
        {k: sa.bindparam(k, type_=table.c[k].type) for k in keys}
    ).on_conflict_do_nothing()


def save_definition(conn: Connection, graph: GraphModel, now: float) -> None:
    """Snapshot the definition a run executes (kept once per (workflow, version))."""
    values = {
        "workflow_id": graph.workflow_id,
        "version": graph.version,
        "graph": graph.model_dump(mode="json"),
        "created_at": now,
    }
    stmt = _insert_ignore(conn.dialect.name == "postgresql", definitions, tuple(values))
    execute(conn, stmt, values, later=True)  # (nobody reads its result)


@functools.cache
def _insert(table: sa.Table, keys: tuple[str, ...]) -> Any:
    return table.insert().values({k: sa.bindparam(k, type_=table.c[k].type) for k in keys})


@functools.cache
def _drain_query() -> Any:
    return sa.select(drains.c.target).where(drains.c.workflow_id == sa.bindparam("wf"))


@functools.cache
def _by_key_query() -> Any:
    return sa.select(runs.c.id, runs.c.input_fingerprint, runs.c.workflow_id).where(
        runs.c.idempotency_key == sa.bindparam("key")
    )


def load_graph(conn: Connection, workflow_id: str, version: str) -> GraphModel | None:
    row = conn.execute(
        sa.select(definitions.c.graph).where(
            definitions.c.workflow_id == workflow_id, definitions.c.version == version
        )
    ).first()
    return None if row is None else GraphModel.model_validate(row.graph)


def load_graphs(
    conn: Connection, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], GraphModel]:
    """The stored definitions of the (workflow, version) ``keys`` the database has."""
    if not keys:
        return {}
    t = definitions
    rows = conn.execute(
        sa.select(t.c.workflow_id, t.c.version, t.c.graph).where(
            t.c.workflow_id.in_(sorted({w for w, _ in keys}))
        )
    ).all()
    wanted = set(keys)
    return {
        (r.workflow_id, r.version): GraphModel.model_validate(r.graph)
        for r in rows
        if (r.workflow_id, r.version) in wanted
    }


_STAGE_KEYS = ("run_id", "stage_id", "status", "attempt", "suspensions", "has_output", "started_at")


def _insert_stages(
    conn: Connection, run_id: str, ids: list[str], started: Collection[str], now: float
) -> None:
    """Insert the stage rows of a run being created: pending, those of ``started`` (handed
    to a worker in this transaction) running their first attempt since ``now``. One
    statement whatever their number, sent with the COMMIT."""
    status = [StageStatus.RUNNING if s in started else StageStatus.PENDING for s in ids]
    if conn.dialect.name == "postgresql":
        params = {"run_id": run_id, "now": now, "s_ids": ids, "s_status": status}
        execute(conn, _pg_stages_insert(), params, later=True)
        return
    rows = [
        {
            "run_id": run_id,
            "stage_id": sid,
            "status": st,
            "attempt": int(st == StageStatus.RUNNING),
            "suspensions": 0,
            "has_output": False,
            "started_at": now if st == StageStatus.RUNNING else None,
        }
        for sid, st in zip(ids, status, strict=True)
    ]
    execute_many(conn, _insert(stages, _STAGE_KEYS), rows, later=True)


@functools.cache
def _pg_stages_insert() -> Any:
    """PostgreSQL: :func:`_insert_stages` as one statement of one shape (the ids and
    statuses as arrays); a running stage is at attempt 1, started at ``now`` (as
    ``_schedule.attempt_started`` makes it)."""
    given = (
        sa.func.unnest(
            sa.bindparam("s_ids", type_=postgresql.ARRAY(sa.String)),
            sa.bindparam("s_status", type_=postgresql.ARRAY(sa.String)),
        )
        .table_valued("stage_id", "status")
        .render_derived()
        .alias("given")
    )
    running = given.c.status == sa.literal_column(f"'{StageStatus.RUNNING.value}'")
    now = sa.cast(sa.bindparam("now"), sa.Double)
    rows = sa.select(
        sa.bindparam("run_id", type_=sa.String),
        given.c.stage_id,
        given.c.status,
        sa.case((running, sa.literal_column("1")), else_=sa.literal_column("0")),
        sa.literal_column("0"),
        sa.false(),
        sa.case((running, now), else_=sa.null()),
    )
    return stages.insert().from_select(list(_STAGE_KEYS), rows)


def case_twin(conn: Connection, run_id: str) -> str | None:
    """The id of an existing run that differs from ``run_id`` only in case, if any (a
    caller-chosen run id: on a case-insensitive blob store both runs' blobs would share one
    folder). An all-lower-case twin is found by its primary key, any other by the partial
    index of such ids (``ix_wfe_runs_id_folded``); on PostgreSQL a lock on the lower-case
    form holds two creations of such twins apart until the first commits."""
    folded = run_id.lower()
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:f))"), {"f": folded})
    mixed = sa.select(runs.c.id).where(
        sa.func.lower(runs.c.id) == folded, sa.text(CASE_TWIN_WHERE), runs.c.id != run_id
    )
    found = conn.execute(mixed.limit(1)).first()
    if found is None and folded != run_id:
        found = conn.execute(sa.select(runs.c.id).where(runs.c.id == folded)).first()
    return None if found is None else str(found.id)


def create_run(
    conn: Connection,
    graph: GraphModel | GraphShape,
    run_id: str,
    input_value: Any,
    fingerprint: str,
    key: str | None,
    now: float,
    trace_context: str | None = None,
    handoff: Handoff | None = None,
    define: bool = True,
    ids: list[int] | None = None,
    max_pending: int | None = None,
) -> tuple[str, bool]:
    """Insert the run, its stages, run.created and the first group's jobs. With an
    idempotency key already used, return that run (or raise on a different input). With
    ``handoff``, the first stages are leased to that worker and begun in this transaction.
    ``define``: also save the graph's definition (False: a committed transaction of this
    process saved it already; definitions are never deleted). ``ids`` (PostgreSQL): job ids
    reserved by earlier transactions, taken from and refilled here; with enough of them and
    no idempotency key the transaction reads nothing first (one round trip): the drain is
    checked by its first statement, which fails the transaction (:func:`refused_unread`) and
    the caller tries again without ``ids``."""
    shape = graph if isinstance(graph, GraphShape) else GraphShape(graph)
    graph = shape.graph
    if handoff is not None:
        handoff.jobs.clear()  # (a re-run of this transaction hands off only its own jobs)
    reserve = 0
    if handoff is not None and handoff.limit > 0 and conn.dialect.name == "postgresql":
        reserve = min(len(shape.groups[0]), JOBS_CHUNK) if shape.groups else 0
    got = _creation_reads(conn, graph.workflow_id, key, reserve, handoff, ids)
    if key is not None:
        existing = got[1].first()
        if existing is not None:
            if (existing.input_fingerprint, existing.workflow_id) != (
                fingerprint,
                graph.workflow_id,
            ):
                raise IdempotencyConflictError(key, existing.id)
            return existing.id, False
    if define:
        save_definition(conn, graph, now)
    values = dict(
        id=run_id,
        workflow_id=graph.workflow_id,
        version=graph.version,
        status=RunStatus.PENDING,
        input=input_value,
        input_fingerprint=fingerprint,
        idempotency_key=key,
        current_group=0,
        group_open=None,  # (counted by the schedule below)
        event_seq=0,
        completed_count=0,
        redrive_count=0,
        cancel_requested=False,
        deadline=None if graph.timeout_s is None else now + graph.timeout_s,
        frozen=False,
        created_at=now,
        updated_at=now,
        trace_context=trace_context,
        max_pending_signals=max_pending,
    )
    # the row to write, as the schedule below sees it (it needs the run's fields); written
    # after it, once, with what the schedule sets (status, group counts) and the number of
    # its first events: no second version of the row in the transaction that creates it
    run = SimpleNamespace(**values)
    run_values: dict[str, Any] = {}
    drafts = [Lifecycle(run_id).run_created(graph.version)]
    # (the stage rows just inserted are known: not read back)
    known = fresh_rows([s.id for s in graph.stages])
    drafts += schedule(
        conn, run, shape, now, handoff, run_values=run_values, known=known, unwritten=True
    )
    started = set() if handoff is None else {job.stage_id for job, _ in handoff.jobs}
    _insert_stages(conn, run_id, [s.id for s in graph.stages], started, now)
    if handoff is not None:
        handoff.reserved = []  # (ids not used are gaps in the sequence, nothing more)
    row = values | run_values | {"event_seq": len(drafts)}
    # (on PostgreSQL these inserts go out in one round trip with the next statement)
    execute(conn, _insert(runs, tuple(row)), row, later=True)
    append_first_events(conn, run, drafts, now)
    return run_id, True


def _creation_reads(
    conn: Connection,
    workflow_id: str,
    key: str | None,
    reserve: int,
    handoff: Handoff | None,
    ids: list[int] | None,
) -> list[Any]:
    """What :func:`create_run` reads before it writes, in one round trip on PostgreSQL: a
    drain (raises WorkflowDrainedError), the run of the idempotency ``key`` (the second
    result), and ``reserve`` job ids for the stages handed off (``handoff.reserved``: their
    jobs then go out with the COMMIT) and ids ahead for the creations after this one. Given
    enough ``ids`` and no key, nothing: the drain is checked by the first write, the handed
    jobs take ids from ``ids``."""
    postgres = conn.dialect.name == "postgresql"
    if postgres and ids is not None and key is None and len(ids) >= reserve:
        execute(conn, _drain_guard(), {"wf": workflow_id}, later=True)
        if handoff is not None:
            handoff.reserved = [(i, None) for i in ids[:reserve]]
            del ids[:reserve]
        return []
    calls = [(_drain_query(), {"wf": workflow_id})]
    if key is not None:
        calls.append((_by_key_query(), {"key": key}))
    refill = 0 if ids is None or not postgres else max(IDS_AHEAD - len(ids), 0)
    if reserve + refill:
        calls.append(reserve_ids(reserve + refill))
    got = execute_together(conn, calls) if len(calls) > 1 else [execute(conn, *calls[0])]
    drain = got[0].first()
    if drain is not None:
        raise WorkflowDrainedError(workflow_id, drain.target)
    taken = reserved(got[-1]) if reserve + refill else []
    if ids is not None:
        ids += [i for i, _ in taken[reserve:]]
    if handoff is not None:
        handoff.reserved = taken[:reserve]
    return got


IDS_AHEAD = 32
"""Job ids a creation reserves for the next ones of its process (PostgreSQL), when it reads
anyway: those then need no read round trip of their own."""

_REFUSED = "22012"
"""The SQLSTATE of :func:`_drain_guard` refusing a creation (a division by zero)."""


@functools.cache
def _drain_guard() -> Any:
    """PostgreSQL: fails (division by zero) when the workflow is drained, else one row."""
    drained = sa.exists().where(drains.c.workflow_id == sa.bindparam("wf"))
    return sa.select(sa.literal(1) / sa.cast(~drained, sa.Integer))


def refused_unread(exc: BaseException) -> bool:
    """Whether a creation given job ids failed on its drain check (and wrote nothing): tried
    again without them, it reads the drain and raises WorkflowDrainedError."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == _REFUSED


def _refuse_frozen(run: Any, action: str) -> None:
    if run.frozen:
        raise frozen_run_error(run.id, action, "native")


@functools.cache
def _signal_counts() -> Any:
    run_id, name = sa.bindparam("run_id", type_=sa.String), sa.bindparam("name", type_=sa.String)
    return sa.select(
        sa.select(sa.func.count())
        .where(signals.c.run_id == run_id, signals.c.consumed.is_(False))
        .scalar_subquery(),
        sa.select(sa.func.count())
        .where(
            stages.c.run_id == run_id,
            stages.c.status == StageStatus.SUSPENDED,
            stages.c.waiting_for == sa.bindparam("waiting", type_=sa.String),
        )
        .scalar_subquery(),
        sa.select(sa.func.count())
        .where(signals.c.run_id == run_id, signals.c.name == name, signals.c.consumed.is_(False))
        .scalar_subquery(),
        # the stage whose job a lease of the woken jobs takes first (``_jobs.claim_woken``)
        sa.select(jobs.c.stage_id)
        .where(
            jobs.c.run_id == run_id,
            jobs.c.status.in_([sa.literal("waiting"), sa.literal("ready")]),  # (not expanding)
            jobs.c.waiting_for == sa.bindparam("waiting", type_=sa.String),
        )
        .order_by(jobs.c.id)
        .limit(1)
        .scalar_subquery(),
    )


@functools.cache
def _wake_signalled() -> Any:
    return (
        sa.update(jobs)
        .where(
            jobs.c.run_id == sa.bindparam("run_id"),
            jobs.c.status == "waiting",
            jobs.c.waiting_for == sa.bindparam("waiting"),
        )
        .values(status="ready", available_at=sa.bindparam("now"))
        .returning(jobs.c.id)
    )


def signal_run(
    conn: Connection,
    run_id: str,
    name: str,
    payload: Any,
    now: float,
    idempotency_key: str | None = None,
    max_pending: int | None = None,
    known_graph: Callable[[str, str], GraphModel | None] | None = None,
) -> SignalResult:
    """Queue a signal (see :func:`signal_and_claim`)."""
    return signal_and_claim(
        conn, run_id, name, payload, now, idempotency_key, max_pending, known_graph
    ).result


Call = tuple[Any, dict[str, Any]]

Claim = Callable[[Any, "str | None"], "list[Call] | None"]
"""Given the locked run row and the stage whose job the lease would take first (None: no job
waits for the signal), the statement (and parameters) that leases the job a signal wakes
(``_jobs.claim_woken``) and reads that do not depend on its result, sent with it (their
results in :attr:`Signalled.ahead`); or None."""


class Signalled(NamedTuple):
    """What :func:`signal_and_claim` did: the caller's answer, the job the claim leased (or
    None), whether the signal is the only unconsumed one of its name, the run row as this
    transaction left it, the stage ``claim`` expected its lease to take, and the results of
    the claim's reads ahead."""

    result: SignalResult
    job: Any
    alone: bool
    run: Any
    expected: str | None
    ahead: list[Any]


def signal_and_claim(
    conn: Connection,
    run_id: str,
    name: str,
    payload: Any,
    now: float,
    idempotency_key: str | None = None,
    max_pending: int | None = None,
    known_graph: Callable[[str, str], GraphModel | None] | None = None,
    claim: Claim | None = None,
) -> Signalled:
    """Queue a signal behind the run's earlier ones of its name (the run row is locked, so
    ids follow arrival order); a repeat of ``idempotency_key`` is not queued again. A run
    holding ``max_pending`` unconsumed signals (or the bound it was created with, when it
    keeps one: ``runs.max_pending_signals``) refuses more (SignalQueueFullError).
    ``known_graph(workflow, version)``: the registry's graph, if it has it (else the stored
    definition is read); ``claim``: see :data:`Claim`."""
    waiting_for = f"signal:{name}"
    # the run (locked) and three counts in one round trip: unconsumed signals (for
    # max_pending), suspended waits for this name, unconsumed signals of this name; and the
    # stage whose job a lease after the wake would take first
    run, counts = run_and(
        conn, run_id, _signal_counts(), {"run_id": run_id, "name": name, "waiting": waiting_for}
    )
    if run is None:
        raise RunNotFoundError(run_id)
    if run.status not in ACTIVE or run.cancel_requested:
        raise RunNotActiveError(
            run_id, run.status, f"signal {name!r} to", migrated_to=run.migrated_to
        )
    _refuse_frozen(run, f"signal {name!r}")
    graph = None if known_graph is None else known_graph(run.workflow_id, run.version)
    if graph is None:
        graph = load_graph(conn, run.workflow_id, run.version)
    check_signal_known(graph, run_id, name)
    if idempotency_key is not None:
        seen = conn.execute(
            sa.select(signals.c.id).where(
                signals.c.run_id == run_id, signals.c.idempotency_key == idempotency_key
            )
        ).first()
        if seen is not None:
            repeat = SignalResult(run_id=run_id, name=name, delivered=False, already_completed=True)
            return Signalled(repeat, None, False, run, None, [])
    pending, waiting, queued, first_waiting = counts.first()
    # the bound the run was created with (never 0); a run created before v17 has none
    max_pending = run.max_pending_signals or max_pending
    if max_pending is not None and pending >= max_pending:
        raise SignalQueueFullError(run_id, name, max_pending)
    signal = {
        "run_id": run_id,
        "name": name,
        "payload": payload,
        "idempotency_key": idempotency_key,
        "consumed": False,
        "received_at": now,
    }
    # (sent with the update below, in one round trip)
    execute(conn, _insert(signals, tuple(signal)), signal, later=True)
    wake = (_wake_signalled(), {"run_id": run_id, "waiting": waiting_for, "now": now})
    take = None if claim is None else claim(run, first_waiting)
    ahead: list[Any] = []
    if take is None:
        woken, job = execute(conn, *wake), None
    else:  # the wake, the lease of the job it makes ready and the reads ahead: one round trip
        woken, leased, *ahead = execute_together(conn, [wake, *take])
        job = leased.first()
    woken_ids = [r.id for r in woken]
    if woken_ids:
        if job is None or woken_ids != [job.id]:
            # the waiting stage's next worker may be in another process; a job this
            # transaction leased to the caller's worker is nobody else's to claim
            notify_due(conn)
        # a job of the run is ready now: a suspended run runs (what refresh_status would
        # conclude from its jobs, without reading them)
        if run.status == RunStatus.SUSPENDED:
            touch(conn, run_id, now, status=RunStatus.RUNNING)
            run = run._replace(status=RunStatus.RUNNING, updated_at=now)
    else:
        refresh_status(conn, run_id, now, run.status)  # (the locked row: no second read)
        run = None  # (its status is what refresh_status made it: unknown here)
    # delivered: a suspended wait for this name is there to take it, i.e. more waits than
    # signals already queued ahead of it; else it stays buffered for a later wait
    result = SignalResult(
        run_id=run_id, name=name, delivered=waiting > queued, already_completed=False
    )
    return Signalled(result, job, queued == 0, run, first_waiting, ahead)


def cancel_run(conn: Connection, run_id: str, now: float) -> bool:
    """Returns False when the run was already cancelled (a no-op)."""
    run = lock_run(conn, run_id)
    if run.status == RunStatus.CANCELLED or run.cancel_requested:
        return False
    if run.status == RunStatus.COMPENSATING:
        return False  # already rolling back after a failure; it ends failed
    if run.status in TERMINAL:
        raise RunNotActiveError(run_id, run.status, "cancel", migrated_to=run.migrated_to)
    _refuse_frozen(run, "cancel")
    conn.execute(sa.update(runs).where(runs.c.id == run_id).values(cancel_requested=True))
    run = lock_run(conn, run_id)
    drafts = begin_compensation(conn, run, now)
    append_events(conn, run, drafts, now)
    return True


def redrive_run(
    conn: Connection,
    run_id: str,
    from_: str,
    graph: GraphModel,
    now: float,
) -> None:
    """Re-run a terminal run under the same id; ``graph`` is the version it runs on now."""
    run = lock_run(conn, run_id)
    if run.status not in REDRIVABLE_RUN_STATUSES:
        raise RunNotActiveError(run_id, run.status, "redrive")
    rows = {
        r.stage_id: r
        for r in conn.execute(sa.select(stages).where(stages.c.run_id == run_id)).all()
    }
    rerun = redrive_plan(graph, from_, {sid: r.status for sid, r in rows.items()}, run_id)
    # (a statement for all the stages, not one per stage: a wide run's redrive was two
    # round trips a stage on PostgreSQL)
    archived = [
        {
            "run_id": run_id,
            "redrive": run.redrive_count,
            "stage_id": sid,
            # (without the import's note of a suspension sent at the source: bookkeeping)
            "record": {
                k: v
                for k, v in rows[sid]._mapping.items()
                if k not in ("run_id", "announced_suspension")
            },
        }
        for sid in sorted(rerun)
        if rows[sid].attempt > 0
    ]
    if archived:
        conn.execute(stage_archive.insert(), archived)
    if from_ != "last_failure":
        conn.execute(
            sa.delete(steps).where(steps.c.run_id == run_id, steps.c.stage_id.in_(sorted(rerun)))
        )
    # a compensation after this redrive is a new one: it runs its steps again (as on
    # Temporal, whose compensation journals are per redrive), never replays the last one's
    # (stage ids cannot hold '#': only compensation ledgers end so)
    conn.execute(
        sa.delete(steps).where(steps.c.run_id == run_id, steps.c.stage_id.like("%#compensation"))
    )
    conn.execute(
        sa.update(stages)
        .where(stages.c.run_id == run_id, stages.c.stage_id.in_(sorted(rerun)))
        .values(
            status=StageStatus.PENDING,
            attempt=0,
            suspensions=0,
            output=None,
            has_output=False,
            error=None,
            compensation_error=None,
            completed_order=None,
            waiting_for=None,
            wake_at=None,
            started_at=None,
            finished_at=None,
            announced_suspension=None,
        )
    )
    keep = sorted(set(rows) - rerun)  # (redrive_plan checked that these are the stage ids)
    if keep:
        conn.execute(
            sa.update(stages)
            .where(stages.c.run_id == run_id, stages.c.stage_id.in_(keep))
            .values(status=StageStatus.COMPLETED, compensation_error=None)
        )
    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run_id))
    conn.execute(
        sa.delete(staged_events).where(
            staged_events.c.run_id == run_id, staged_events.c.stage_id.in_(sorted(rerun))
        )
    )
    first_group = min(graph.group_of(s) for s in rerun)
    redrive = run.redrive_count + 1
    conn.execute(
        sa.update(runs)
        .where(runs.c.id == run_id)
        .values(
            status=RunStatus.RUNNING,
            version=graph.version,
            error=None,
            compensation_errors=None,
            cancel_requested=False,
            finished_at=None,
            output=None,
            redrive_count=redrive,
            current_group=first_group,
            updated_at=now,
            deadline=None if graph.timeout_s is None else now + graph.timeout_s,
        )
    )
    save_definition(conn, graph, now)
    run = lock_run(conn, run_id)
    drafts = [Lifecycle(run_id, redrive).run_redriven(from_, graph.version)]
    drafts += schedule(conn, run, graph, now)
    append_events(conn, run, drafts, now)


def repin_run(
    conn: Connection,
    run: Any,
    from_: str,
    run_graph: GraphModel,
    graph: GraphModel,
    now: float,
) -> bool:
    """Re-pin ``run`` (the locked row of a run that has not ended) from ``run_graph``, its
    version, to ``graph``: the run row's version and the routing of its jobs (a job is
    claimed by a worker serving its "workflow@version") move together, so a worker of
    ``graph``'s version claims the pending or parked jobs and runs its bodies; completed
    stages, journals, waits and queued signals stay. Refused while a stage attempt runs
    (a leased job: the claim of a worker of the old version would run the old body and its
    outcome would be refused) and for a frozen run. False: nothing to do (same version)."""
    _refuse_frozen(run, "redrive")
    if run.status not in WORKING_RUN_STATUSES or run.cancel_requested:
        raise RunNotActiveError(run.id, run.status, "redrive", migrated_to=run.migrated_to)
    # lock the run's jobs (PostgreSQL: a claim's FOR UPDATE SKIP LOCKED then skips them, and
    # one that leased a job before us is seen as leased once it commits)
    held = conn.execute(
        sa.select(jobs.c.stage_id, jobs.c.status)
        .where(jobs.c.run_id == run.id)
        .order_by(jobs.c.id)
        .with_for_update()
    ).all()
    leased = [j.stage_id for j in held if j.status == "leased"]
    if leased:
        raise RunNotActiveError(run.id, run.status, "redrive", running=leased[0])
    if not repin_plan(run_graph, graph, from_, run.id):
        return False
    conn.execute(
        sa.update(jobs)
        .where(jobs.c.run_id == run.id)
        .values(wfv=version_key(graph.workflow_id, graph.version))
    )
    redrive = run.redrive_count + 1
    conn.execute(
        sa.update(runs)
        .where(runs.c.id == run.id)
        .values(version=graph.version, redrive_count=redrive, updated_at=now)
    )
    save_definition(conn, graph, now)
    run = lock_run(conn, run.id)
    append_events(conn, run, [Lifecycle(run.id, redrive).run_redriven(from_, graph.version)], now)
    if any(j.status == "ready" for j in held):
        notify_due(conn)  # (idle workers of the new version in other processes claim at once)
    return True


@functools.cache
def _status_query() -> Any:
    return sa.select(runs.c.status).where(runs.c.id == sa.bindparam("run_id"))


def run_status(conn: Connection, run_id: str) -> str:
    status = conn.execute(_status_query(), {"run_id": run_id}).scalar()
    if status is None:
        raise RunNotFoundError(run_id)
    return str(status)


def run_statuses(conn: Connection, run_ids: list[str]) -> dict[str, str]:
    """{run id: status} of those of ``run_ids`` that exist (``wait()``'s shared look)."""
    out: dict[str, str] = {}
    for i in range(0, len(run_ids), 500):
        chunk = run_ids[i : i + 500]
        rows = conn.execute(sa.select(runs.c.id, runs.c.status).where(runs.c.id.in_(chunk)))
        out.update({str(r.id): str(r.status) for r in rows})
    return out


def read_run(
    conn: Connection,
    run_id: str,
    known: Callable[[str, str], GraphModel | None] | None = None,
) -> tuple[Any, list[Any], GraphModel | None]:
    """The run row, its stage rows and its graph (``known(workflow, version)`` first: the
    registry's, without reading and validating the stored definition)."""
    run, got = run_and(conn, run_id, stages_of_run(), {"k_run_id": run_id}, lock=False)
    if run is None:
        raise RunNotFoundError(run_id)
    rows = got.all()
    graph = None if known is None else known(run.workflow_id, run.version)
    if graph is None:
        graph = load_graph(conn, run.workflow_id, run.version)
    return run, list(rows), graph


def runs_query(
    workflow_id: str | None,
    status: Sequence[str] | None,
    limit: int,
    before: tuple[float, str] | None = None,
    id_prefix: str | None = None,
    version: str | None = None,
    created_after: float | None = None,
    idempotency_key: str | None = None,
    *,
    sqlite: bool = False,
) -> sa.Select[Any]:
    """The query of :func:`read_runs` for the run rows (``bench/tools/ui_pages.py`` shows
    its plans): newest first on an index of (created_at, id), led by the filter's status,
    workflow or workflow and version where there is one. Several statuses are one query per
    status (each reads its newest ``limit`` from the status index), merged: an ``IN`` of
    statuses reads every run of them and sorts them for each page (SQLite's plan; 0.7 s a
    page at 48,000 runs). ``sqlite``: the database is SQLite (see ``id_prefix`` below)."""
    # (a limit past a 64-bit integer raised a raw OverflowError on SQLite, "bigint out of
    # range" on PostgreSQL; no database holds that many runs)
    limit = min(limit, MAX_LISTED)
    statuses = list(dict.fromkeys(status or ()))

    def where(q: sa.Select[Any], which: list[str]) -> sa.Select[Any]:
        filters = (before, id_prefix, version, created_after, idempotency_key, sqlite)
        return _runs_where(q, workflow_id, which, *filters)

    if len(statuses) > 1:
        parts = [
            where(sa.select(runs), [s])
            .order_by(runs.c.created_at.desc(), runs.c.id.desc())
            .limit(limit)
            .subquery()
            for s in statuses
        ]
        merged = sa.union_all(*(sa.select(p) for p in parts)).subquery("listed")
        return (
            sa.select(merged).order_by(merged.c.created_at.desc(), merged.c.id.desc()).limit(limit)
        )
    q = sa.select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
    return where(q, statuses)


def _runs_where(
    q: sa.Select[Any],
    workflow_id: str | None,
    status: list[str],
    before: tuple[float, str] | None,
    id_prefix: str | None,
    version: str | None,
    created_after: float | None,
    idempotency_key: str | None,
    sqlite: bool,
) -> sa.Select[Any]:
    if id_prefix:
        # LIKE for PostgreSQL's pattern index; the substr comparison for the case: SQLite's
        # LIKE ignores it, so a prefix "ABC" listed the run "abc..." there alone
        q = q.where(
            runs.c.id.startswith(id_prefix, autoescape=True),
            sa.func.substr(runs.c.id, 1, len(id_prefix)) == id_prefix,
        )
        if sqlite and ord(id_prefix[-1]) < 0x10FFFF:
            # SQLite's LIKE uses no index (it ignores case): the ids from the prefix up to
            # the next one, a range of the primary key (binary order, as UTF-8 compares), so
            # a search reads the matches and not every run (PostgreSQL: the pattern index)
            after = id_prefix[:-1] + chr(ord(id_prefix[-1]) + 1)
            q = q.where(runs.c.id >= id_prefix, runs.c.id < after)
    if version is not None:
        q = q.where(runs.c.version == version)
    if created_after is not None:
        q = q.where(runs.c.created_at >= created_after)
    if idempotency_key is not None:
        q = q.where(runs.c.idempotency_key == idempotency_key)
    if before is not None:
        # a row comparison: PostgreSQL scans the (created_at, id) index from the cursor on (an
        # index condition); the equivalent OR was a filter on a backward scan from the newest
        # run, which read every run newer than the cursor (5,050 at page 102 of 10,000)
        q = q.where(sa.tuple_(runs.c.created_at, runs.c.id) < sa.tuple_(*before))
    if workflow_id is not None:
        q = q.where(runs.c.workflow_id == workflow_id)
    if status:
        q = q.where(runs.c.status.in_(status))
    return q


def read_runs(
    conn: Connection,
    workflow_id: str | None,
    status: Sequence[str] | None,
    limit: int,
    before: tuple[float, str] | None = None,
    id_prefix: str | None = None,
    version: str | None = None,
    created_after: float | None = None,
    idempotency_key: str | None = None,
) -> list[tuple[Any, list[Any], GraphModel | None]]:
    """The newest ``limit`` runs (of one workflow, in some statuses, of one version, created
    at or after ``created_after``, with one idempotency key; created before the run
    ``before`` = (created_at, id) in this order) as :func:`read_run` gives one: a query for
    the runs, one per 500 of them for their stages, one per definition, in one transaction
    (not a transaction per run, as listing by id and reading each did)."""
    q = runs_query(
        workflow_id,
        status,
        limit,
        before,
        id_prefix,
        version,
        created_after,
        idempotency_key,
        sqlite=conn.dialect.name == "sqlite",
    )
    run_rows = conn.execute(q).all()
    by_run: dict[str, list[Any]] = {r.id: [] for r in run_rows}
    ids = list(by_run)
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for row in conn.execute(sa.select(stages).where(stages.c.run_id.in_(chunk))):
            by_run[row.run_id].append(row)
    graphs: dict[tuple[str, str], GraphModel | None] = {}
    for r in run_rows:
        key = (r.workflow_id, r.version)
        if key not in graphs:
            graphs[key] = load_graph(conn, r.workflow_id, r.version)
    return [(r, by_run[r.id], graphs[(r.workflow_id, r.version)]) for r in run_rows]


def list_versions(
    conn: Connection, served: Collection[tuple[str, str]], latest: dict[str, str]
) -> list[VersionInfo]:
    active = dict(
        ((r.workflow_id, r.version), r.n)
        for r in conn.execute(
            sa.select(runs.c.workflow_id, runs.c.version, sa.func.count().label("n"))
            .where(runs.c.status.in_([s.value for s in ACTIVE] + [RunStatus.COMPENSATING.value]))
            .group_by(runs.c.workflow_id, runs.c.version)
        ).all()
    )
    known = {
        (r.workflow_id, r.version)
        for r in conn.execute(sa.select(definitions.c.workflow_id, definitions.c.version)).all()
    }
    keys = sorted(known | set(served) | set(active))
    targets = {r.workflow_id: r.target for r in conn.execute(sa.select(drains)).all()}
    return [
        VersionInfo(
            workflow_id=w,
            version=v,
            active_runs=active.get((w, v), 0),
            served_here=(w, v) in served,
            drained=active.get((w, v), 0) == 0,
            latest=latest.get(w) == v,
            new_runs_to=targets.get(w),
        )
        for w, v in keys
    ]


def purgeable(finished_before: float) -> sa.Select[Any]:
    """Terminal runs finished before the cutoff. A run is created before it finishes, so
    only runs created before the cutoff are looked at (the runs index by creation time):
    the status index read every finished run, 0.15-0.2 s at a million, in a write
    transaction every second where no run was old enough. (``status || ''`` keeps planners
    off the status index, which every finished run matches.)"""
    return sa.select(runs.c.id).where(
        runs.c.created_at < finished_before,
        runs.c.finished_at < finished_before,
        runs.c.status.concat("").in_([str(s) for s in TERMINAL]),
    )


def any_purgeable(conn: Connection, finished_before: float) -> bool:
    """Whether :func:`purge_runs` would find a run (a read: no write lock for nothing)."""
    return conn.execute(purgeable(finished_before).limit(1)).first() is not None


def purge_runs(conn: Connection, finished_before: float, limit: int) -> list[str]:
    """Delete up to ``limit`` terminal runs finished before the cutoff, with their rows.

    On PostgreSQL the runs are locked as they are picked (skipping one another transaction
    holds) and their status is read again under the lock, before any of their rows is
    deleted: a purge that read a failed run as another server redrove it deleted the run the
    redrive had just re-started (a run reported ``running`` vanished), and deleting its
    stages before the run row locked rows in the opposite order to the redrive's."""
    stmt = purgeable(finished_before).limit(limit)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    ids = list(conn.execute(stmt).scalars())
    if ids:
        for table in (stages, steps, signals, staged_events, jobs, outbox, stage_archive):
            conn.execute(sa.delete(table).where(table.c.run_id.in_(ids)))
        conn.execute(sa.delete(runs).where(runs.c.id.in_(ids)))
    return ids


def _overdue(now: float) -> sa.Select[Any]:
    return sa.select(runs.c.id).where(
        runs.c.status.in_(list(ACTIVE)),
        runs.c.deadline < now,
        runs.c.cancel_requested.is_(False),
        runs.c.frozen.is_(False),
    )


def _orphans(now: float, grace: float) -> sa.Select[Any]:
    return sa.select(runs.c.id, runs.c.status).where(
        runs.c.status.in_([s.value for s in ACTIVE] + [RunStatus.COMPENSATING.value]),
        runs.c.updated_at < now - grace,
        runs.c.id.not_in(sa.select(jobs.c.run_id)),
    )


def any_stuck(conn: Connection, now: float, grace: float) -> bool:
    """Whether :func:`reap_stuck` would find a run: a read (no write lock) that looks at
    every active run, so that the write transaction is only taken when there is work."""
    return any(
        conn.execute(stmt.limit(1)).first() is not None
        for stmt in (_overdue(now), _orphans(now, grace))
    )


def reap_stuck(conn: Connection, now: float, grace: float, graphs: Any) -> int:
    """Fail runs past their run timeout; re-schedule active runs that lost their jobs."""
    n = 0
    overdue = conn.execute(_overdue(now)).scalars().all()
    for rid in overdue:
        run = lock_run(conn, rid)
        # (the run's own timeout: its deadline was fixed at its start)
        err = ErrorInfo.of(RunTimeoutError(rid, run.deadline - run.created_at))
        conn.execute(sa.update(runs).where(runs.c.id == rid).values(error=err.model_dump()))
        append_events(conn, run, begin_compensation(conn, lock_run(conn, rid), now), now)
        n += 1
    orphans = conn.execute(_orphans(now, grace)).all()
    for o in orphans:
        run = lock_run(conn, o.id)
        if o.status == RunStatus.COMPENSATING:
            begin_compensation(conn, run, now)
        else:
            graph = graphs(conn, run)
            if graph is not None:
                append_events(conn, run, schedule(conn, run, graph, now), now)
        n += 1
    return n


def set_drain(
    conn: Connection, workflow_ids: Sequence[str], target: str | None, now: float
) -> None:
    """Mark workflows as draining to ``target`` (None lifts the drain)."""
    conn.execute(sa.delete(drains).where(drains.c.workflow_id.in_(list(workflow_ids))))
    if target is not None and workflow_ids:
        conn.execute(
            drains.insert(),
            [{"workflow_id": w, "target": target, "created_at": now} for w in workflow_ids],
        )


def list_steps(conn: Connection, run_id: str) -> list[StepEntry]:
    """The run's journaled steps (no results), by stage and name."""
    if try_run(conn, run_id, lock=False) is None:
        raise RunNotFoundError(run_id)
    rows = conn.execute(
        sa.select(
            steps.c.stage_id, steps.c.name, steps.c.kind, steps.c.completed, steps.c.signal
        ).where(steps.c.run_id == run_id)
    ).all()
    # sorted here, by code point as on every driver: PostgreSQL's ORDER BY follows the
    # database's collation ("a#compensation" and "ab" change places under en_US)
    return [
        StepEntry(
            stage=r.stage_id, name=r.name, kind=r.kind, completed=bool(r.completed), signal=r.signal
        )
        for r in sorted(rows, key=lambda r: (r.stage_id, r.name))
    ]
