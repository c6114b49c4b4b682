"""One outage is one outage: a transaction begun before the database went out of reach whose
answer was already on its way (it went through as the proxy cut the server off) does not end
the outage another call noticed meanwhile. It did: the outage was logged as over, then as
begun again at the next failed retry, and counted twice (``test_db_outage_log`` waited for
the count of 2 that it jumped over, in a clean clone on a quiet machine)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from driver_native._db import Database


def _cut() -> OperationalError:
    return OperationalError(
        "SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True
    )


def test_an_answer_begun_before_the_outage_does_not_end_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'wfe.db'}", retry_seconds=30)
    caplog.set_level(logging.INFO, logger="wfe.db")
    noticed, a_done = threading.Event(), threading.Event()
    tries: list[int] = []

    def b(_attempt: object) -> str:  # out of reach twice, then through
        tries.append(1)
        if len(tries) == 1:
            noticed.set()
            raise _cut()
        if len(tries) == 2:
            assert a_done.wait(30)
            raise _cut()
        return "b"

    def a(_attempt: object) -> str:  # begun before b noticed the outage, answered after
        assert noticed.wait(30)
        deadline = time.monotonic() + 30
        while db.outages == 0:  # (b's failure is being counted)
            assert time.monotonic() < deadline
            threading.Event().wait(0.001)
        return "a"

    try:
        other = threading.Thread(target=lambda: tries.append(db._retrying_sync(b) == "b"))
        result: list[str] = []
        runner = threading.Thread(target=lambda: result.append(db._retrying_sync(a)))
        runner.start()
        other.start()
        runner.join(30)
        a_done.set()
        other.join(30)
        assert result == ["a"] and tries[-1] is True
        records = [r.levelno for r in caplog.records if r.name == "wfe.db"]
        assert records == [logging.WARNING, logging.INFO], caplog.text
        assert db.outages == 1
    finally:
        db.dispose()
