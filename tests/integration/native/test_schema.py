"""Versioned schema migrations: a fresh database, and an upgrade from v1 with live runs."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import sqlalchemy as sa

from driver_native import ClaimPending, CreateRun, Database, ExecuteJob, Kernel, _schema
from driver_native._ledger import step_record
from engine_port import ClaimCheck, EngineSettings, FolderBlobStore, Registry, SystemClock
from engine_port.errors import SignalQueueFullError
from tests.support.databases import PostgresSession

from . import workflows as w
from .conftest import MakeEngine


def _copy_v1_rows(source: Database, target: Database) -> None:
    def copy(conn: sa.Connection) -> None:
        insp = sa.inspect(conn)
        for table in _schema.metadata.sorted_tables:
            if table.name == "wfe_schema" or not insp.has_table(table.name):
                continue
            serial = "id" in table.c and table.c.id.autoincrement is True
            cols = [c["name"] for c in insp.get_columns(table.name)]
            if serial:  # let the target number them (PostgreSQL sequences), in the same order
                cols.remove("id")
            rows = source.tx_sync(
                lambda c, t=table, cs=cols: [
                    dict(r._mapping)
                    for r in c.execute(
                        sa.select(*[t.c[n] for n in cs]).order_by(*t.primary_key.columns)
                    ).all()
                ]
            )
            if rows:
                conn.execute(table.insert(), rows)

    target.tx_sync(copy)


def _kernel(db: Database, url: str, tmp_path: Path) -> Kernel:
    """A kernel of the linear test workflow on ``db`` (blobs in ``tmp_path``)."""
    settings = EngineSettings(database_url=url)
    claim = ClaimCheck(FolderBlobStore(tmp_path / "blobs"))
    return Kernel(db, Registry([w.linear]), settings, claim, SystemClock(), None)


def _tables(db: Database) -> set[str]:
    return set(db.tx_sync(lambda c: sa.inspect(c).get_table_names()))


def test_fresh_database_reaches_latest_version(database_url: str) -> None:
    db = Database(database_url)
    try:
        assert db.schema_version() == 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (a user's first connect prints nothing)
            applied = db.upgrade()
        assert applied == [v for v, _, _ in _schema.MIGRATIONS]
        assert db.schema_version() == _schema.LATEST_SCHEMA_VERSION
        assert {t.name for t in _schema.metadata.sorted_tables} <= _tables(db)
        assert db.upgrade() == []  # idempotent: nothing left to apply
    finally:
        db.dispose()


def test_an_upgrade_warns_nothing_whatever_the_processs_warning_filters(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warning filters are the process's: another thread's ``catch_warnings`` (a second
    engine connecting, a test runner) may put them back while an upgrade runs on a database
    thread. An upgrade that silenced a warning of its own there printed SQLAlchemy's
    "Skipped unsupported reflection of expression-based index" (seen in the suite's clean
    clones); an upgrade must make no warning at all."""
    monkeypatch.setattr(warnings, "filterwarnings", lambda *a, **k: None)  # (put back at once)
    db = Database(database_url)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert db.upgrade() == [v for v, _, _ in _schema.MIGRATIONS]
    finally:
        db.dispose()


async def test_a_database_a_newer_wfe_wrote_is_refused_not_used(
    database_url: str, tmp_path: Path
) -> None:
    """An older wfe (a host not upgraded, a rolled-back deploy) used a database at a schema
    version it does not know as if it were its own: create_engine(), the CLI and
    ``wfe db upgrade`` now refuse it with a DriverUnavailableError saying to upgrade wfe."""
    from typer.testing import CliRunner

    from engine_port import create_engine
    from engine_port.errors import DriverUnavailableError
    from wfe_cli import app

    db = Database(database_url)
    try:
        db.upgrade()
        newer = _schema.LATEST_SCHEMA_VERSION + 1
        db.tx_sync(lambda c: c.execute(_schema.schema_info.update().values(version=newer)))
        with pytest.raises(DriverUnavailableError, match=f"schema version {newer}, which a newer"):
            db.upgrade()
    finally:
        db.dispose()
    settings = EngineSettings(database_url=database_url, blob_url=f"file://{tmp_path}/blobs")
    with pytest.raises(DriverUnavailableError, match="upgrade wfe"):
        async with create_engine(settings, Registry([])):
            pass
    for args in (["runs"], ["db", "upgrade"]):
        result = CliRunner().invoke(app, args, env={"WFE_DATABASE_URL": database_url})
        assert result.exit_code != 0 and "which a newer wfe wrote" in result.stderr, args


async def test_v15_turns_errors_reset_to_json_null_into_sql_null(
    database_url: str, tmp_path: Path
) -> None:
    """A redrive of older code reset the stages' compensation_error to the JSON text 'null'
    (not SQL NULL), so a later failure of the run compensated nothing; v15 repairs such
    rows (and the other error columns) and leaves real errors and outputs alone."""
    db = Database(database_url)
    try:
        db.upgrade()
        run_id, _ = await _kernel(db, database_url, tmp_path).dispatch(
            CreateRun("it-linear", {"n": 1})
        )

        def reset_as_old_code_did(conn: sa.Connection) -> None:
            conn.execute(
                sa.text("UPDATE wfe_stages SET compensation_error = 'null', error = 'null'")
            )
            conn.execute(
                sa.text("UPDATE wfe_stages SET error = '{\"type\": \"E\"}' WHERE stage_id = 'b'")
            )
            conn.execute(
                sa.text("UPDATE wfe_runs SET error = 'null', compensation_errors = 'null'")
            )
            conn.execute(sa.text("UPDATE wfe_schema SET version = 14"))

        def nulls(conn: sa.Connection) -> list[tuple[str, bool, bool]]:
            rows = conn.execute(
                sa.text(
                    "SELECT stage_id, compensation_error IS NULL, error IS NULL FROM wfe_stages "
                    "WHERE run_id = :r ORDER BY stage_id"
                ),
                {"r": run_id},
            ).all()
            run = conn.execute(
                sa.text("SELECT error IS NULL, compensation_errors IS NULL FROM wfe_runs")
            ).one()
            return [(r[0], bool(r[1]), bool(r[2])) for r in rows] + [("run", *map(bool, run))]

        db.tx_sync(reset_as_old_code_did)
        assert db.upgrade()[:2] == [15, 16]
        assert db.tx_sync(nulls) == [
            ("a", True, True),
            ("b", True, False),
            ("c", True, True),
            ("run", True, True),
        ]
    finally:
        db.dispose()


async def test_v16_adds_step_meta_and_reads_older_steps_as_they_were_written(
    database_url: str, tmp_path: Path
) -> None:
    """A timed-out wait of older code is the result ``{"$wfe_step_timeout": ...}`` with no
    meta: after v16 it still replays as a timeout; a step journaled now with that result
    and its meta is a value (a signal payload may have any shape)."""
    db = Database(database_url)
    try:
        db.upgrade()
        run_id, _ = await _kernel(db, database_url, tmp_path).dispatch(
            CreateRun("it-linear", {"n": 1})
        )
        marker = '{"$wfe_step_timeout": "2026-01-01T00:00:00+00:00"}'

        def as_v15(conn: sa.Connection) -> None:
            conn.execute(sa.text("ALTER TABLE wfe_steps DROP COLUMN meta"))
            conn.execute(
                sa.text(
                    "INSERT INTO wfe_steps (run_id, stage_id, name, kind, completed, result) "
                    "VALUES (:r, 'a', 'go', 'signal', true, :m)"
                ),
                {"r": run_id, "m": marker},
            )
            conn.execute(sa.text("UPDATE wfe_schema SET version = 15"))

        db.tx_sync(as_v15)
        assert db.upgrade()[:1] == [16]
        [old] = db.tx_sync(lambda c: c.execute(sa.select(_schema.steps)).all())
        record = step_record(old)
        assert record.meta is None and record.timed_out
        assert not record.done(record.result).timed_out  # journaled now: a value
    finally:
        db.dispose()


async def test_v17_keeps_the_starting_engines_bound_and_older_runs_take_the_senders(
    make_engine: MakeEngine, database_url: str
) -> None:
    """v17 keeps a run's ``max_pending_signals`` with it; a run created before (NULL) is
    bounded by the signalling engine's setting, as it was."""
    engine = await make_engine(w.waiter, max_pending_signals=1)
    old = await engine.start("it-waiter", {"n": 1})

    def as_v16(conn: sa.Connection) -> None:
        conn.execute(sa.text("ALTER TABLE wfe_runs DROP COLUMN max_pending_signals"))
        conn.execute(sa.text("UPDATE wfe_schema SET version = 16"))

    engine.kernel.db.tx_sync(as_v16)
    assert engine.kernel.db.upgrade()[:1] == [17]
    sender = await make_engine(w.waiter, max_pending_signals=2)
    for i in range(2):  # (its run row has no bound: the sender's 2, not the starter's 1)
        await sender.signal(old.id, "junk", i)
    with pytest.raises(SignalQueueFullError) as caught:
        await sender.signal(old.id, "junk", 2)
    assert caught.value.limit == 2
    new = await engine.start("it-waiter", {"n": 2})
    await sender.signal(new.id, "junk", 0)
    with pytest.raises(SignalQueueFullError):
        await sender.signal(new.id, "junk", 1)  # the run's own bound: 1


async def test_v21_adds_the_announced_suspension_of_stages_and_keeps_older_rows(
    make_engine: MakeEngine,
) -> None:
    """v21 adds stages.announced_suspension (an imported wait's suspension, sent at the
    source); the stage rows of a v20 database read NULL there (nothing known: as before)."""
    engine = await make_engine(w.waiter)
    run = await engine.start("it-waiter", {"n": 1})
    db = engine.kernel.db

    def as_v20(conn: sa.Connection) -> None:
        conn.execute(sa.text("ALTER TABLE wfe_stages DROP COLUMN announced_suspension"))
        conn.execute(sa.text("UPDATE wfe_schema SET version = 20"))

    db.tx_sync(as_v20)
    assert db.upgrade()[:1] == [21]
    assert db.schema_version() == _schema.LATEST_SCHEMA_VERSION

    def announced(conn: sa.Connection) -> list[object]:
        rows = conn.execute(
            sa.select(_schema.stages.c.announced_suspension).where(
                _schema.stages.c.run_id == run.id
            )
        )
        return [r.announced_suspension for r in rows]

    stages = db.tx_sync(announced)
    assert stages and all(a is None for a in stages), stages
    assert db.upgrade() == []  # (idempotent)


def test_upgrade_from_v11_adds_the_partial_indexes_of_failed_events_and_due_jobs(
    database_url: str,
) -> None:
    db = Database(database_url)
    try:
        db.tx_sync(lambda c: _schema.upgrade(c, target=11))
        # (v1 creates today's tables: a v11 database of old code had no such indexes)
        for index in ("ix_wfe_outbox_failing", "ix_wfe_jobs_due"):
            db.tx_sync(lambda c, i=index: c.execute(sa.text(f"DROP INDEX {i}")))
        assert db.upgrade()[:2] == [12, 13]

        def indexes(conn: sa.Connection) -> set[str]:
            return {
                str(i["name"])
                for table in ("wfe_outbox", "wfe_jobs")
                for i in sa.inspect(conn).get_indexes(table)
            }

        assert {"ix_wfe_outbox_failing", "ix_wfe_jobs_due"} <= db.tx_sync(indexes)
    finally:
        db.dispose()


async def test_upgrade_from_v1_keeps_existing_runs(
    database_url: str, tmp_path: Path, make_engine: MakeEngine, request: pytest.FixtureRequest
) -> None:
    # Runs made by the current code on a database of its own, then copied into a database
    # that stays at schema v1 (only the columns v1 has): what an old deployment leaves behind.
    if database_url.startswith("sqlite"):
        source_url = f"sqlite:///{tmp_path / 'source.db'}"
    else:
        source_url = request.getfixturevalue("pg_session").new_schema()
    source = Database(source_url)
    try:
        source.upgrade()
        kernel = _kernel(source, source_url, tmp_path)
        done_id, _ = await kernel.dispatch(CreateRun("it-linear", {"n": 1}))
        for _ in range(3):
            (job,) = await kernel.dispatch(ClaimPending("v1-host"))
            assert await kernel.dispatch(ExecuteJob(job, "v1-host")) == "completed"
        open_id, _ = await kernel.dispatch(CreateRun("it-linear", {"n": 5}, "key-v1"))
        db = Database(database_url)
        try:
            assert db.tx_sync(lambda c: _schema.upgrade(c, target=1)) == [1]
            assert db.schema_version() == 1
            assert "wfe_blobs" not in _tables(db)
            _copy_v1_rows(source, db)
        finally:
            db.dispose()
    finally:
        source.dispose()

    engine = await make_engine(w.linear, blob_url=f"file://{tmp_path / 'blobs'}")
    assert engine.kernel.db.schema_version() == _schema.LATEST_SCHEMA_VERSION
    assert "wfe_blobs" in _tables(engine.kernel.db)
    done = await engine.get_run(done_id)
    assert done.status == "completed"
    assert done.output == {"result": 5}
    pending = await engine.get_run(open_id)
    assert pending.status == "pending"
    assert pending.idempotency_key == "key-v1"
    async with engine.worker():
        finished = await engine.wait(open_id, timeout=20)
    assert finished.status == "completed"
    assert finished.output == {"result": 13}
    # 9 lifecycle events + 1 business event, numbered without gaps
    assert [e.seq for e in await engine.events(open_id)] == list(range(1, 11))


def test_v4_moves_the_one_signal_per_name_table_into_the_queue(database_url: str) -> None:
    """A database at v3 made by the code of that time had wfe_signals (one row per run and
    name); v4 moves its rows into wfe_signal_queue, oldest first, and drops it."""
    db = Database(database_url)
    try:
        assert db.tx_sync(lambda c: _schema.upgrade(c, target=3)) == [1, 2, 3]
        legacy = sa.Table(
            "wfe_signals",
            sa.MetaData(),
            sa.Column("run_id", sa.String(64), primary_key=True),
            sa.Column("name", sa.String(300), primary_key=True),
            sa.Column("payload", sa.JSON),
            sa.Column("consumed", sa.Boolean, nullable=False),
            sa.Column("received_at", sa.Double, nullable=False),
        )

        def make_v3(conn: sa.Connection) -> None:
            _schema.signals.drop(conn)  # v1 of today's code already made the queue
            legacy.create(conn)
            conn.execute(
                legacy.insert(),
                [
                    {"run_id": "r1", "name": "late", "payload": 2, "consumed": False,
                     "received_at": 20.0},
                    {"run_id": "r1", "name": "early", "payload": {"n": 1}, "consumed": False,
                     "received_at": 10.0},
                    {"run_id": "r2", "name": "go", "payload": None, "consumed": True,
                     "received_at": 15.0},
                ],
            )  # fmt: skip

        db.tx_sync(make_v3)
        assert db.upgrade() == [v for v, *_ in _schema.MIGRATIONS if v >= 4]
        assert "wfe_signals" not in _tables(db)
        q = _schema.signals
        rows = db.tx_sync(
            lambda c: c.execute(
                sa.select(
                    q.c.run_id, q.c.name, q.c.payload, q.c.consumed, q.c.idempotency_key
                ).order_by(q.c.id)
            ).all()
        )
        assert [tuple(r) for r in rows] == [
            ("r1", "early", {"n": 1}, False, None),
            ("r2", "go", None, True, None),
            ("r1", "late", 2, False, None),
        ]
    finally:
        db.dispose()


async def test_v11_adds_the_claim_token_to_the_jobs_of_a_v10_database(
    database_url: str, make_engine: MakeEngine
) -> None:
    """A database made before v11 (jobs without lease_token), with a run waiting for its
    first stage: the upgrade adds the column (existing jobs at 0) and the run completes."""
    old = await make_engine(w.linear)
    run = await old.start("it-linear", {"n": 1})

    def back_to_v10(c: sa.Connection) -> None:  # what a v10 database has
        c.execute(sa.text("ALTER TABLE wfe_jobs DROP COLUMN lease_token"))
        c.execute(sa.update(_schema.schema_info).values(version=10))

    await old.kernel.db.tx(back_to_v10)
    await old.close()
    engine = await make_engine(w.linear)
    assert engine.kernel.db.schema_version() == _schema.LATEST_SCHEMA_VERSION

    def tokens(c: sa.Connection) -> list[int]:
        return list(c.execute(sa.select(_schema.jobs.c.lease_token)).scalars())

    assert await engine.kernel.db.read(tokens) == [0]
    (job,) = await engine.kernel.dispatch(ClaimPending("v11-host"))
    assert job.lease_token == 1
    assert await engine.kernel.dispatch(ExecuteJob(job, "v11-host")) == "completed"
    async with engine.worker():
        info = await engine.wait(run.id, timeout=20)
    assert (info.status, info.output) == ("completed", {"result": 5})


async def test_v14_drops_the_unique_index_of_event_ids_and_keeps_the_events(
    database_url: str, make_engine: MakeEngine
) -> None:
    """A v13 database (outbox event ids indexed as unique) with a run under way: the upgrade
    drops that index (on SQLite by making the table again), keeps every event with its row id,
    and the run completes with its events numbered on from where they were."""
    old = await make_engine(w.linear)
    run = await old.start("it-linear", {"n": 1})
    before = [(e.id, e.seq) for e in await old.events(run.id)]
    assert before
    v13 = _schema.outbox.to_metadata(sa.MetaData())
    v13.append_constraint(sa.UniqueConstraint("event_id"))

    def back_to_v13(c: sa.Connection) -> None:  # the outbox of a v13 database
        rows = [dict(r._mapping) for r in c.execute(sa.select(_schema.outbox))]
        c.execute(sa.text("DROP TABLE wfe_outbox"))
        v13.create(c)
        c.execute(v13.insert(), rows)
        if c.dialect.name == "postgresql":  # (its id sequence where a v13 one would be)
            c.execute(sa.text("SELECT setval(pg_get_serial_sequence('wfe_outbox', 'id'), 100)"))
        c.execute(sa.update(_schema.schema_info).values(version=13))

    def shape(c: sa.Connection) -> tuple[list[list[str]], set[str], list[tuple[int, str]]]:
        insp = sa.inspect(c)
        uniques = [list(u["column_names"]) for u in insp.get_unique_constraints("wfe_outbox")]
        indexes = {str(i["name"]) for i in insp.get_indexes("wfe_outbox")}
        rows = c.execute(sa.select(_schema.outbox.c.id, _schema.outbox.c.event_id)).all()
        return uniques, indexes, sorted((int(r[0]), str(r[1])) for r in rows)

    await old.kernel.db.tx(back_to_v13)
    uniques, _, rows_v13 = await old.kernel.db.read(shape)
    assert uniques == [["event_id"]]
    await old.close()

    engine = await make_engine(w.linear)
    assert engine.kernel.db.schema_version() == _schema.LATEST_SCHEMA_VERSION
    uniques, indexes, rows = await engine.kernel.db.read(shape)
    assert uniques == []
    assert {i.name for i in _schema.outbox.indexes} <= indexes
    assert rows == rows_v13  # every event kept, with its row id
    async with engine.worker():
        info = await engine.wait(run.id, timeout=20)
    assert (info.status, info.output) == ("completed", {"result": 5})
    events = [(e.id, e.seq) for e in await engine.events(run.id)]
    assert events[: len(before)] == before
    assert [seq for _, seq in events] == list(range(1, len(events) + 1))


@pytest.mark.postgres
async def test_a_user_who_may_not_create_or_use_the_tables_is_told_what_to_grant(
    pg_session: PostgresSession, tmp_path: Path
) -> None:
    """A PostgreSQL database nobody upgraded, reached as a user who may not create tables in
    it (every user but the owner of schema public, since PostgreSQL 15): create_engine() and
    ``wfe db upgrade`` raised SQLAlchemy's ProgrammingError ("permission denied for schema"),
    which the CLI called a bug (exit 1). Now a DriverUnavailableError (exit 5, as a wrong
    password) says what to grant; so once the owner created the tables, until they are
    granted; then the user works."""
    import uuid

    from typer.testing import CliRunner

    from engine_port import create_engine
    from engine_port.errors import DriverUnavailableError
    from wfe_cli import EXIT_CODES, app

    owner_url = sa.make_url(pg_session.new_schema())
    schema = owner_url.query["options"].split("=", 1)[1]
    role = f"wfe_user_{uuid.uuid4().hex[:8]}"
    user_url = owner_url.set(username=role).render_as_string(hide_password=False)
    admin = pg_session.engine
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
        c.execute(sa.text(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"'))
    settings = EngineSettings(database_url=user_url, blob_url=f"file://{tmp_path}/blobs")
    try:
        for missing in ("schema", "table wfe_schema"):
            with pytest.raises(DriverUnavailableError) as raised:
                async with create_engine(settings, Registry([])):
                    pass
            text = str(raised.value)
            assert f"the database user '{role}' may not do what wfe needs" in text
            assert f"permission denied for {missing}" in text, text
            assert "'wfe db upgrade'" in text and "grant this user USAGE" in text
            for args in (["db", "upgrade"], ["runs"]):
                result = CliRunner().invoke(app, args, env={"WFE_DATABASE_URL": user_url})
                if missing == "schema" and args == ["runs"]:  # (the CLI's own check)
                    assert "has no wfe tables" in result.stderr, result.output
                else:
                    assert f"permission denied for {missing}" in result.stderr, result.output
                    assert "this is a bug" not in result.stderr
                assert result.exit_code == EXIT_CODES["unavailable"], (args, result.output)
            if missing == "schema":  # the owner creates them
                db = Database(owner_url.render_as_string(hide_password=False))
                try:
                    db.upgrade()
                finally:
                    db.dispose()
        with admin.connect() as c:  # as the message says
            c.execute(sa.text(f'GRANT ALL ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'))
            c.execute(sa.text(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"'))
        async with create_engine(settings, Registry([])) as engine:
            assert await engine.list_runs() == []
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP OWNED BY "{role}"'))
            c.execute(sa.text(f'DROP ROLE "{role}"'))
