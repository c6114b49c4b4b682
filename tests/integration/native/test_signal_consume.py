"""Taking a signal (``_ledger._consume``) while a parallel stage of the same run takes the
same one: the loser waits for the winner's commit and takes the next signal, never the same
one twice and never none while one is left. On PostgreSQL the read and the take are one
statement (a data-modifying CTE), so the race is decided inside it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection

from driver_native._db import Database
from driver_native._jobs import Lease, reap_stale
from driver_native._ledger import _LOST, _MISSING, _consume
from driver_native._schema import jobs, signals
from engine_port import StepRecord


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.upgrade()
    yield database
    database.dispose()


def _queue(db: Database, *payloads: int, expires: float = 1e12) -> None:
    def put(conn: Connection) -> None:
        conn.execute(  # the job whose lease each take is made under
            jobs.insert().values(
                id=JOB,
                run_id="r",
                stage_id="s",
                kind="stage",
                wfv="wf@1",
                status="leased",
                lease_owner="w",
                lease_expires_at=expires,
                created_at=1.0,
            )
        )
        for n in payloads:
            conn.execute(
                signals.insert().values(
                    run_id="r", name="go", payload={"n": n}, consumed=False, received_at=1.0
                )
            )

    db.tx_sync(put)


JOB = 1
LEASE = Lease(JOB, "w", 0)  # (the job row's first lease_token, as inserted here)


def _rec(name: str) -> StepRecord:
    return StepRecord(name=name, kind="signal", completed=False, signal="go")


def test_two_stages_racing_for_a_signal_take_one_each(db: Database) -> None:
    if not db.is_postgres:
        pytest.skip("SQLite serializes writers: no two takes overlap")
    _queue(db, 1, 2)
    holding, release = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def first(conn: Connection) -> Any:
        taken = _consume(conn, "r", "a", _rec("wait-a"), LEASE)
        holding.set()
        release.wait(10)  # the row lock on signal 1 is held until this commits
        return taken

    def second() -> None:
        got["b"] = db.tx_sync(_consume, "r", "b", _rec("wait-b"), LEASE)

    t1 = threading.Thread(target=lambda: got.update(a=db.tx_sync(first)))
    t1.start()
    assert holding.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(0.5)  # blocked behind the first take's lock
    release.set()
    t1.join(10)
    t2.join(10)
    assert got == {"a": {"n": 1}, "b": {"n": 2}}
    assert db.tx_sync(_consume, "r", "c", _rec("wait-c"), LEASE) is _MISSING

    def left(conn: Connection) -> int:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(signals.c.consumed.is_(False))
            ).scalar_one()
        )

    assert db.read_sync(left) == 0


def test_a_take_holds_the_lease_until_it_commits(db: Database) -> None:
    """The take locks the job row (FOR SHARE) until its transaction ends: a reap of the
    expired lease meanwhile skips it; once the reap has taken the lease back, a take by the
    worker that held it takes nothing."""
    if not db.is_postgres:
        pytest.skip("SQLite serializes writers: no reap overlaps a take")
    _queue(db, 1, 2, expires=1.0)  # (expired long ago)
    holding, release = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def take(conn: Connection) -> Any:
        taken = _consume(conn, "r", "a", _rec("wait-a"), LEASE)
        holding.set()
        release.wait(10)
        return taken

    t = threading.Thread(target=lambda: got.update(a=db.tx_sync(take)))
    t.start()
    assert holding.wait(10)
    assert db.tx_sync(reap_stale, 2.0) == []  # (the row is locked by the take: skipped)
    release.set()
    t.join(10)
    assert got == {"a": {"n": 1}}
    assert [r.id for r in db.tx_sync(reap_stale, 2.0)] == [JOB]
    assert db.tx_sync(_consume, "r", "b", _rec("wait-b"), LEASE) is _LOST
