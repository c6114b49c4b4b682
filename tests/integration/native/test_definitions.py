"""A run's definition (the graph it executes, kept once per workflow and version) is written
by the first start of that version a process commits, not by every start: the snapshot of a
large graph was serialised, sent and ignored on conflict with every run."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from engine_port.errors import IdempotencyConflictError

from . import workflows as w
from .conftest import MakeEngine, count_rows


async def test_a_definition_is_written_by_the_first_committed_start_only(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(w.linear)
    writes: list[str] = []

    def seen(_conn: Any, _cursor: Any, sql: str, *_a: Any) -> None:
        if "INSERT INTO wfe_definitions" in sql:
            writes.append(sql)

    event.listen(engine.kernel.db.engine, "before_cursor_execute", seen)
    first = await engine.start(w.linear, {"n": 1}, idempotency_key="k")
    assert len(writes) == 1
    # a start whose transaction does not commit a run does not count as having written it
    with pytest.raises(IdempotencyConflictError):
        await engine.start(w.linear, {"n": 2}, idempotency_key="k")
    await engine.start(w.linear, {"n": 3})
    await engine.start(w.linear, {"n": 4})
    assert len(writes) == 1
    assert await count_rows(engine, "wfe_definitions") == 1
    # another process on the same database writes it once too (ignored: it is there)
    other = await make_engine(w.linear)
    event.listen(other.kernel.db.engine, "before_cursor_execute", seen)
    second = await other.start(w.linear, {"n": 5})
    assert len(writes) == 2
    assert await count_rows(engine, "wfe_definitions") == 1
    async with engine.worker():
        for run in (first, second):
            assert (await engine.wait(run.id, timeout=30)).status == "completed"
