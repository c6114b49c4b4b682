"""The native driver's schema: SQLAlchemy Core tables and versioned migrations.

Times are stored as float seconds since the epoch (UTC), which compare the same way on SQLite
and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Connection,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    select,
)
from sqlalchemy.schema import CreateIndex

__all__ = ["LATEST_SCHEMA_VERSION", "MIGRATIONS", "metadata", "schema_version", "upgrade"]

metadata = MetaData()

schema_info = Table(
    "wfe_schema",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
)

definitions = Table(
    "wfe_definitions",
    metadata,
    Column("workflow_id", String(200), primary_key=True),
    Column("version", String(100), primary_key=True),
    Column("graph", JSON, nullable=False),
    Column("created_at", Double, nullable=False),
)

# a JSON column where None means "none" (an error, the compensation errors): written as SQL
# NULL, so that ``IS NULL`` finds it. (A plain JSON column writes None as the JSON text 'null':
# a redrive's ``compensation_error=None`` made every stage look compensated already, and a
# later failure compensated nothing.) Outputs keep plain JSON: a stage may return None.
_ABSENT_AS_NULL = JSON(none_as_null=True)

LISTING_INDEXES = (
    Index("ix_wfe_runs_status_created", "status", "created_at", "id"),
    Index("ix_wfe_runs_wf_created", "workflow_id", "created_at", "id"),
    Index("ix_wfe_runs_wfv_created", "workflow_id", "version", "created_at", "id"),
)
"""The runs indexes of ``_runs.runs_query``'s filters, newest first (made by v20)."""

runs = Table(
    "wfe_runs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("workflow_id", String(200), nullable=False),
    Column("version", String(100), nullable=False),
    Column("status", String(20), nullable=False),
    Column("input", JSON),
    Column("input_fingerprint", String(64)),
    Column("idempotency_key", String(300), unique=True),
    Column("output", JSON),
    Column("error", _ABSENT_AS_NULL),
    Column("compensation_errors", _ABSENT_AS_NULL),
    Column("current_group", Integer, nullable=False, default=0),
    # stages of the current group not completed yet (NULL: unknown, counted again by the
    # next transition that schedules): a completion elsewhere in a wide group is O(1)
    Column("group_open", Integer),
    Column("event_seq", Integer, nullable=False, default=0),
    Column("completed_count", Integer, nullable=False, default=0),
    Column("redrive_count", Integer, nullable=False, default=0),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("deadline", Double),
    Column("migrated_to", String(300)),
    Column("frozen", Boolean, nullable=False, default=False, server_default=sa.false()),
    Column("trace_context", String(200)),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("finished_at", Double),
    # the starting engine's ``max_pending_signals`` (NULL: a run created before v17, bound by
    # the signalling engine's setting)
    Column("max_pending_signals", Integer),
    Index("ix_wfe_runs_wf", "workflow_id", "version", "status"),
    Index("ix_wfe_runs_created", "created_at", "id"),  # list_runs: newest first, keyset pages
    # list_runs by status, workflow, or workflow and version: each index gives the matching
    # runs newest first, so a page reads its own rows and no more (v20; a planner without
    # them, SQLite's, sorted every match for each page: 0.7 s a page of 50 among 48,000)
    *LISTING_INDEXES,
    # run id prefix search (LIKE 'abc%'): the primary key's index serves it only under the C
    # collation, so PostgreSQL gets a pattern index (SQLite lists are small; it has none)
    Index("ix_wfe_runs_id_prefix", "id", postgresql_ops={"id": "varchar_pattern_ops"}).ddl_if(
        dialect="postgresql"
    ),
)
# run ids with an upper-case letter, by their lower-case form: a caller-chosen run id that
# differs only in case from an existing one is refused (``_runs.case_twin``): on a
# case-insensitive blob store both runs' blobs would share one folder. Generated ids are
# lower-case: the index holds only the few chosen ones and costs their creation nothing.
# (SQLite uses a partial index only for a query whose WHERE repeats the index's term.)
# Made by v19 alone, in SQL, not declared on the table (a fresh database's v1 would make it);
# the migrations create indexes with IF NOT EXISTS, never by reflecting the table's indexes,
# where SQLAlchemy warns that it skips an expression index (``_create_index``).
CASE_TWIN_WHERE = "id <> lower(id)"

stages = Table(
    "wfe_stages",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("stage_id", String(200), primary_key=True),
    Column("status", String(20), nullable=False),
    Column("attempt", Integer, nullable=False, default=0),
    Column("suspensions", Integer, nullable=False, default=0),
    Column("output", JSON),
    Column("has_output", Boolean, nullable=False, default=False),
    Column("error", _ABSENT_AS_NULL),
    Column("compensation_error", _ABSENT_AS_NULL),
    Column("completed_order", Integer),
    Column("waiting_for", String(300)),
    Column("wake_at", Double),
    Column("started_at", Double),
    Column("finished_at", Double),
    # the id of the stage.suspended an import knows the source emitted for the wait the
    # stage is imported suspended in (v21; NULL for any other stage): ``_progress._announced``
    Column("announced_suspension", String(64)),
)

stage_archive = Table(
    "wfe_stage_archive",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False, index=True),
    Column("redrive", Integer, nullable=False),
    Column("stage_id", String(200), nullable=False),
    Column("record", JSON, nullable=False),
)

DUE_PREDICATE = "status IN ('ready', 'waiting') AND available_at IS NOT NULL"
"""Jobs a worker may claim once their time has come (``ix_wfe_jobs_due``; a query must say
it in these literal words for a planner to use that partial index)."""

jobs = Table(
    "wfe_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("stage_id", String(200), nullable=False),
    Column("kind", String(20), nullable=False),  # stage | compensate
    Column("wfv", String(310), nullable=False),  # "workflow@version": what a host must serve
    Column("status", String(20), nullable=False),  # ready | waiting | leased
    Column("available_at", Double),
    Column("waiting_for", String(300)),
    Column("attempt", Integer, nullable=False, default=1),
    Column("lease_owner", String(200)),
    Column("lease_expires_at", Double),
    # counts the job's claims: each claim takes the next number, and every write of the
    # attempt it began (journal, signal take, outcome, heartbeat, give-back) names it, so a
    # stale attempt is refused even when its own worker claimed the job again
    Column("lease_token", Integer, nullable=False, default=0, server_default=sa.text("0")),
    Column("created_at", Double, nullable=False),
    UniqueConstraint("run_id", "stage_id", "kind", name="uq_wfe_jobs_stage"),
    Index("ix_wfe_jobs_claim", "status", "available_at"),
    # the due jobs of each "workflow@version": a worker looks for work of the versions it
    # serves without reading the queue of every other one (a drained version's backlog);
    # partial, so a job leased to a worker at once (the local hand-off) never enters it
    Index(
        "ix_wfe_jobs_due",
        "wfv",
        "status",
        "available_at",
        sqlite_where=sa.text(DUE_PREDICATE),
        postgresql_where=sa.text(DUE_PREDICATE),
    ),
    # a run's jobs, and whether any is busy (leased/ready) or waiting, without a scan
    Index("ix_wfe_jobs_run_status", "run_id", "status"),
    sqlite_autoincrement=True,  # a reaped worker's late outcome must never match a new job
)

steps = Table(
    "wfe_steps",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("stage_id", String(200), primary_key=True),
    Column("name", String(500), primary_key=True),
    Column("kind", String(20), nullable=False),
    Column("completed", Boolean, nullable=False),
    Column("result", JSON),
    Column("deadline", Double),
    Column("signal", String(300)),
    # the engine's note about the step, apart from the user's result (StepRecord.meta); NULL:
    # journaled before v16
    Column("meta", _ABSENT_AS_NULL),
)

# Signals of one name queue per run in arrival order: ``id`` (increasing, assigned while the
# run row is locked) is the order; a wait takes the oldest unconsumed row of its name. A
# signal's idempotency key is unique per run (NULLs are distinct on SQLite and PostgreSQL);
# rows stay after consumption, so a repeated key is recognised for the life of the run.
signals = Table(
    "wfe_signal_queue",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("name", String(300), nullable=False),
    Column("payload", JSON),
    Column("idempotency_key", String(300)),
    Column("consumed", Boolean, nullable=False, default=False),
    Column("received_at", Double, nullable=False),
    UniqueConstraint("run_id", "idempotency_key", name="uq_wfe_signal_queue_key"),
    Index("ix_wfe_signal_queue_next", "run_id", "name", "consumed", "id"),
    # a run's unconsumed signals (of every name), counted against max_pending_signals at
    # each signal: without it the count read every signal the run ever took (consumed rows
    # stay), so a long-lived run's signals cost more and more (``_runs._signal_counts``).
    # The predicate is written as the queries render ``consumed.is_(False)``: SQLite uses a
    # partial index only for a query whose WHERE repeats the index's term.
    Index(
        "ix_wfe_signal_queue_pending",
        "run_id",
        "consumed",  # (SQLite: then the count's best index, over the covering one above)
        sqlite_where=sa.text("consumed IS 0"),
        postgresql_where=sa.text("consumed IS false"),
    ),
    sqlite_autoincrement=True,  # ids never reused: the order of a run's queue is its ids
)

staged_events = Table(
    "wfe_staged_events",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("stage_id", String(200), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("type", String(300), nullable=False),
    Column("data", JSON, nullable=False),
)

HELD_PREDICATE = "status = 'pending' AND (claimed_until IS NOT NULL OR next_attempt_at IS NOT NULL)"
"""Outbox events a flush waits for (``ix_wfe_outbox_held``; a query must say it in these
literal words for a planner to use that partial index)."""

outbox = Table(
    "wfe_outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # not unique (v14): an id is a hash of the run and the event's place in it, so its index
    # entries fell at random places of a B-tree nobody reads (a page written per event)
    Column("event_id", String(64), nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("workflow_id", String(200), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", String(300), nullable=False),
    Column("stage_id", String(200)),
    Column("data", JSON, nullable=False),
    Column("business", Boolean, nullable=False, default=False),
    Column("created_at", Double, nullable=False),
    Column("status", String(20), nullable=False),  # pending | delivered | dead
    Column("attempts", Integer, nullable=False, default=0),
    Column("last_error", Text),
    # a failing sink: the first failure, and when the next attempt is due (per-event backoff)
    Column("first_failed_at", Double),
    Column("next_attempt_at", Double),
    # a flush publishing the row right now: who, and until when its claim holds (a flusher
    # that died is replaced once the claim lapses)
    Column("claimed_by", String(200)),
    Column("claimed_until", Double),
    Index("ix_wfe_outbox_status", "status", "id"),
    Index("ix_wfe_outbox_run", "run_id", "seq"),
    # events a sink failed (rare): the worker's gauge counts the retrying ones without
    # reading every undelivered row (``_outbox.count_outbox``)
    # the undelivered events a flush must wait for (claimed by a flush now, or failed and
    # waiting for a retry; few): a flush looks for one of the run before each event it
    # takes. Without it that look read every earlier event of the run (``ix_wfe_outbox_run``),
    # delivered ones too: a flush of 500 events of a run with 49,000 delivered took 16 s,
    # in the write transaction that held SQLite's lock (v20)
    Index(
        "ix_wfe_outbox_held",
        "run_id",
        "seq",
        sqlite_where=sa.text(HELD_PREDICATE),
        postgresql_where=sa.text(HELD_PREDICATE),
    ),
    Index(
        "ix_wfe_outbox_failing",
        "status",
        sqlite_where=sa.text("attempts > 0"),
        postgresql_where=sa.text("attempts > 0"),
    ),
)

command_keys = Table(
    "wfe_command_keys",
    metadata,
    Column("key", String(300), primary_key=True),
    Column("command", String(100), nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("status", String(20), nullable=False),  # in_progress | done
    Column("result", JSON),
    Column("created_at", Double, nullable=False),
)

blobs = Table(
    "wfe_blobs",
    metadata,
    Column("key", String(1000), primary_key=True),
    Column("data", LargeBinary, nullable=False),
)


def _create_index(conn: Connection, table: Table, name: str) -> None:
    """Create the index ``name`` of ``table`` unless it exists (``CREATE INDEX IF NOT
    EXISTS``). Not ``index.create(checkfirst=True)``: that reflects the table's indexes, and
    SQLAlchemy warns that it skips the expression index ``ix_wfe_runs_id_folded`` (an
    ``SAWarning`` a user upgrading saw, whenever another thread's ``catch_warnings`` put the
    filters back while the upgrade ran: the filters are the process's)."""
    index = next(i for i in table.indexes if i.name == name)
    conn.execute(CreateIndex(index, if_not_exists=True))


def _v1(conn: Connection) -> None:
    metadata.create_all(
        conn, tables=[t for t in metadata.sorted_tables if t not in (blobs, drains)]
    )


def _v2(conn: Connection) -> None:
    """v2 added the database-table blob store."""
    blobs.create(conn, checkfirst=True)


drains = Table(
    "wfe_drains",
    metadata,
    Column("workflow_id", String(200), primary_key=True),
    Column("target", String(100), nullable=False),
    Column("created_at", Double, nullable=False),
)


def _v3(conn: Connection) -> None:
    """v3 added runs.frozen (a run being exported to another driver) and wfe_drains (workflows
    whose new runs go to another driver)."""
    drains.create(conn, checkfirst=True)
    if "frozen" not in {c["name"] for c in inspect(conn).get_columns("wfe_runs")}:
        conn.execute(
            sa.text("ALTER TABLE wfe_runs ADD COLUMN frozen BOOLEAN NOT NULL DEFAULT false")
        )


def _v4(conn: Connection) -> None:
    """v4 replaced wfe_signals (one row per run and signal name: a second signal of a name was
    dropped) by wfe_signal_queue (every signal queued in arrival order, with an optional
    idempotency key unique per run). Existing rows move over, consumed ones included."""
    signals.create(conn, checkfirst=True)
    if not inspect(conn).has_table("wfe_signals"):
        return  # created at v1 by this code: the queue already exists
    old = Table("wfe_signals", MetaData(), autoload_with=conn)
    conn.execute(
        signals.insert().from_select(
            ["run_id", "name", "payload", "consumed", "received_at"],
            select(
                old.c.run_id, old.c.name, old.c.payload, old.c.consumed, old.c.received_at
            ).order_by(old.c.received_at, old.c.run_id, old.c.name),
        )
    )
    old.drop(conn)


def _v5(conn: Connection) -> None:
    """v5 added outbox.first_failed_at and outbox.next_attempt_at: a failing sink is retried
    per event with backoff, and dead-lettered only after attempts spanning a minimum time."""
    have = {c["name"] for c in inspect(conn).get_columns("wfe_outbox")}
    if "first_failed_at" not in have:
        conn.execute(sa.text("ALTER TABLE wfe_outbox ADD COLUMN first_failed_at DOUBLE PRECISION"))
    if "next_attempt_at" not in have:
        conn.execute(sa.text("ALTER TABLE wfe_outbox ADD COLUMN next_attempt_at DOUBLE PRECISION"))


def _v6(conn: Connection) -> None:
    """v6 added runs.trace_context: the W3C traceparent of the run's ``wfe.run`` span, the
    parent of its stage spans in any process (OpenTelemetry)."""
    if "trace_context" not in {c["name"] for c in inspect(conn).get_columns("wfe_runs")}:
        conn.execute(sa.text("ALTER TABLE wfe_runs ADD COLUMN trace_context VARCHAR(200)"))


def _v7(conn: Connection) -> None:
    """v7 added outbox.claimed_by and outbox.claimed_until: a flush claims the rows it
    publishes, so two workers never deliver the same events."""
    have = {c["name"] for c in inspect(conn).get_columns("wfe_outbox")}
    if "claimed_by" not in have:
        conn.execute(sa.text("ALTER TABLE wfe_outbox ADD COLUMN claimed_by VARCHAR(200)"))
    if "claimed_until" not in have:
        conn.execute(sa.text("ALTER TABLE wfe_outbox ADD COLUMN claimed_until DOUBLE PRECISION"))


def _v8(conn: Connection) -> None:
    """v8 added an index on runs (created_at, id): listing the newest runs and each keyset page
    after a cursor reads the index instead of sorting every run."""
    _create_index(conn, runs, "ix_wfe_runs_created")


def _v9(conn: Connection) -> None:
    """v9 added runs.group_open (the current group's stages not completed yet, so a stage
    transition of a wide group needs no read of every stage row) and replaced the jobs index
    on run_id by one on (run_id, status) (is any job of the run busy, without a scan).
    Existing runs keep group_open NULL: unknown, counted by their next transition."""
    if "group_open" not in {c["name"] for c in inspect(conn).get_columns("wfe_runs")}:
        conn.execute(sa.text("ALTER TABLE wfe_runs ADD COLUMN group_open INTEGER"))
    _create_index(conn, jobs, "ix_wfe_jobs_run_status")
    conn.execute(sa.text("DROP INDEX IF EXISTS ix_wfe_jobs_run"))


def _v10(conn: Connection) -> None:
    """v10 added, on PostgreSQL, a pattern index on runs.id: a search by run id prefix (the
    web view's) read every run (a sequential scan: 22 ms at 100,000 runs) unless the
    database's collation is C. (v9 is another change's number.)"""
    if conn.dialect.name == "postgresql":
        _create_index(conn, runs, "ix_wfe_runs_id_prefix")


def _v11(conn: Connection) -> None:
    """v11 added jobs.lease_token, the job's claim count: a lease check compared the worker
    id only, so an attempt whose lease was taken over by its own worker (reaped, then claimed
    by the same worker again) still passed it. Existing jobs start at 0 (a lease held across
    the upgrade is held by code that does not check tokens)."""
    if "lease_token" not in {c["name"] for c in inspect(conn).get_columns("wfe_jobs")}:
        conn.execute(
            sa.text("ALTER TABLE wfe_jobs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0")
        )


def _v12(conn: Connection) -> None:
    """v12 added a partial index of the outbox events a sink failed: the worker's outbox
    gauge read every undelivered row to tell the retrying ones apart (0.75 s a count at a
    million events, where no host has a sink)."""
    _create_index(conn, outbox, "ix_wfe_outbox_failing")


def _v13(conn: Connection) -> None:
    """v13 added a partial index of the due jobs by "workflow@version": a worker's look for
    work read every due job of the versions it does not serve (25 ms every 50 ms poll at
    200,000 jobs of a drained version on SQLite)."""
    _create_index(conn, jobs, "ix_wfe_jobs_due")


def _v14(conn: Connection) -> None:
    """v14 dropped the unique index of outbox.event_id: no query reads by it, and an event id
    (a hash of the run and the event's place in it) put each insert at a random place of it,
    one more page written per event (a fifth of a SQLite run's writes). The ids stay what
    they were: deterministic, one per event of a run. SQLite cannot drop a table's UNIQUE, so
    there the table is made again with its rows (ids kept)."""
    unique = [
        u["name"]
        for u in inspect(conn).get_unique_constraints("wfe_outbox")
        if u["column_names"] == ["event_id"]
    ]
    if not unique:
        return
    if conn.dialect.name == "postgresql":
        for name in unique:
            conn.execute(sa.text(f'ALTER TABLE wfe_outbox DROP CONSTRAINT "{name}"'))
        return
    have = [c["name"] for c in inspect(conn).get_columns("wfe_outbox")]
    conn.execute(sa.text("ALTER TABLE wfe_outbox RENAME TO wfe_outbox_v13"))
    for index in outbox.indexes:  # (their names stay with the renamed table)
        conn.execute(sa.text(f"DROP INDEX IF EXISTS {index.name}"))
    outbox.create(conn)
    cols = ", ".join(c for c in have if c in outbox.c)
    conn.execute(sa.text(f"INSERT INTO wfe_outbox ({cols}) SELECT {cols} FROM wfe_outbox_v13"))
    conn.execute(sa.text("DROP TABLE wfe_outbox_v13"))


def _v15(conn: Connection) -> None:
    """The errors written as the JSON text 'null' (a redrive's reset, before these columns
    wrote None as SQL NULL) become SQL NULL: such a stage was taken for one whose compensation
    had failed, and a later failure of its run compensated nothing."""
    for table, column in (
        ("wfe_stages", "compensation_error"),
        ("wfe_stages", "error"),
        ("wfe_runs", "compensation_errors"),
        ("wfe_runs", "error"),
    ):
        conn.execute(
            sa.text(
                f"UPDATE {table} SET {column} = NULL "
                f"WHERE {column} IS NOT NULL AND CAST({column} AS TEXT) = 'null'"
            )
        )


def _v16(conn: Connection) -> None:
    """v16 added steps.meta, the engine's note about a step kept apart from its result: a
    timed-out wait was the result ``{"$wfe_step_timeout": ...}``, so a signal payload or a
    wait's value of that shape replayed as a timeout; and the business events a step's
    function staged were lost when its stage suspended later. Existing rows keep NULL (read
    as before)."""
    if "meta" not in {c["name"] for c in inspect(conn).get_columns("wfe_steps")}:
        conn.execute(sa.text("ALTER TABLE wfe_steps ADD COLUMN meta JSON"))


def _v17(conn: Connection) -> None:
    """v17 added runs.max_pending_signals, the bound of the engine that created the run: the
    signalling engine's setting bounded it, so two processes configured differently refused
    a run's signals at different counts (the Temporal driver keeps the starting engine's in
    the run's start document). Existing rows keep NULL (the signalling engine's, as before)."""
    if "max_pending_signals" not in {c["name"] for c in inspect(conn).get_columns("wfe_runs")}:
        conn.execute(sa.text("ALTER TABLE wfe_runs ADD COLUMN max_pending_signals INTEGER"))


def _v18(conn: Connection) -> None:
    """v18 added a partial index of each run's unconsumed signals: a signal's bound check
    (``max_pending_signals``) counted them by reading every signal the run had ever taken,
    so the 100,001st signal to a run cost 11x its first on SQLite, 7x on PostgreSQL."""
    _create_index(conn, signals, "ix_wfe_signal_queue_pending")


def _v19(conn: Connection) -> None:
    """v19 added a partial index of run ids with an upper-case letter, by their lower-case
    form: a caller-chosen run id differing only in case from an existing one is refused.
    Existing runs keep their ids and their blobs (already twins are not touched)."""
    # (IF NOT EXISTS: an expression index escapes the inspector's checkfirst on SQLite)
    conn.execute(
        sa.text(
            "CREATE INDEX IF NOT EXISTS ix_wfe_runs_id_folded ON wfe_runs (lower(id)) "
            f"WHERE {CASE_TWIN_WHERE}"
        )
    )


def _v20(conn: Connection) -> None:
    """v20 added the runs indexes of each list filter, newest first (status, workflow,
    workflow and version; the status index grew into the first) and a partial index of the
    outbox events a flush waits for: on SQLite a page of runs of one workflow or status
    sorted every matching run (0.7 s a page at 48,000), and a flush read every earlier event
    of each event's run (16 s for 500 events of a run with 49,000 delivered)."""
    for index in LISTING_INDEXES:
        conn.execute(CreateIndex(index, if_not_exists=True))
    conn.execute(sa.text("DROP INDEX IF EXISTS ix_wfe_runs_status"))
    _create_index(conn, outbox, "ix_wfe_outbox_held")


def _v21(conn: Connection) -> None:
    """v21 added stages.announced_suspension, the id of the ``stage.suspended`` a source
    emitted for the signal wait an import takes the stage in suspended: one signal wakes
    every stage waiting for its name, and one that lost it to another suspended again in
    the same wait and sent the source's id a second time, under a new sequence number (the
    target's outbox, where a repeat is looked for, does not hold the source's events).
    Existing rows keep NULL (stages imported before: as before)."""
    if "announced_suspension" not in {c["name"] for c in inspect(conn).get_columns("wfe_stages")}:
        conn.execute(sa.text("ALTER TABLE wfe_stages ADD COLUMN announced_suspension VARCHAR(64)"))


MIGRATIONS: list[tuple[int, str, Callable[[Connection], None]]] = [
    (1, "runs, stages, jobs, step ledger, signals, outbox, command keys", _v1),
    (2, "database-table blob store", _v2),
    (3, "runs.frozen for migrations between drivers", _v3),
    (4, "signals queue in arrival order, with idempotency keys", _v4),
    (5, "outbox retries with backoff: first_failed_at, next_attempt_at", _v5),
    (6, "runs.trace_context for OpenTelemetry", _v6),
    (7, "outbox flush claims: claimed_by, claimed_until", _v7),
    (8, "runs index on (created_at, id) for listing pages", _v8),
    (9, "runs.group_open and jobs index on (run_id, status): transitions of wide graphs", _v9),
    (10, "runs.id pattern index for prefix search (PostgreSQL)", _v10),
    (11, "jobs.lease_token: lease checks name the claim, not only the worker", _v11),
    (12, "outbox partial index of failed events: a cheap retrying count", _v12),
    (13, "jobs partial index of due jobs by version: claims skip other versions' queues", _v13),
    (14, "outbox event ids not indexed as unique: no random index write per event", _v14),
    (15, "errors reset to JSON 'null' by a redrive become SQL NULL", _v15),
    (16, "steps.meta: timeouts and a step's business events apart from its result", _v16),
    (17, "runs.max_pending_signals: the starting engine's bound, kept with the run", _v17),
    (18, "signal queue partial index of unconsumed signals: a flat bound check", _v18),
    (19, "runs partial index of ids by lower case: no chosen run id twins another by case", _v19),
    (20, "runs indexes per list filter, newest first; outbox partial index of held events", _v20),
    (21, "stages.announced_suspension: an imported wait's suspension is not sent twice", _v21),
]
LATEST_SCHEMA_VERSION = MIGRATIONS[-1][0]


def schema_version(conn: Connection) -> int:
    if not inspect(conn).has_table("wfe_schema"):
        return 0
    row = conn.execute(select(schema_info.c.version).where(schema_info.c.id == 1)).first()
    return 0 if row is None else int(row[0])


def upgrade(conn: Connection, target: int = LATEST_SCHEMA_VERSION) -> list[int]:
    """Apply every migration above the database's version up to ``target``; returns the
    versions applied. Runs inside the caller's transaction."""
    current = schema_version(conn)
    if current == 0:
        schema_info.create(conn, checkfirst=True)
        conn.execute(schema_info.insert().values(id=1, version=0))
    applied = []
    for version, _desc, step in MIGRATIONS:
        if current < version <= target:
            step(conn)
            conn.execute(schema_info.update().where(schema_info.c.id == 1).values(version=version))
            applied.append(version)
    return applied
