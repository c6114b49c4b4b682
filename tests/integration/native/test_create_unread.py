"""A run is created without reading first (issue 12, PostgreSQL): the drain is checked by the
first statement sent with the writes, and the handed first stage takes a job id reserved by an
earlier creation of the process. A drained workflow still refuses a start with the typed error
that names its target, writes nothing, and the starts after a lift take the quick path again."""

from __future__ import annotations

import asyncio

import pytest

from engine_port.errors import WorkflowDrainedError

from . import workflows as w
from .conftest import MakeEngine, row_counts


async def test_a_drained_workflow_refuses_starts_that_read_nothing_first(
    make_engine: MakeEngine, round_trips: dict[str, list[int]]
) -> None:
    engine = await make_engine(w.linear)
    async with engine.worker(maintenance_interval=3600):
        warm = await engine.start(w.linear, {"n": 0})  # (reserves job ids ahead)
        assert (await engine.wait(warm.id, timeout=30)).status == "completed"
        before = await row_counts(engine)
        await engine.drain([w.linear.id], "temporal")
        round_trips.clear()
        with pytest.raises(WorkflowDrainedError) as refused:
            await engine.start(w.linear, {"n": 1})
        assert refused.value.target == "temporal" and "temporal" in str(refused.value)
        if engine.kernel.db.is_postgres:
            # the quick try (refused by its first statement), then the read that says why
            assert round_trips["_create_run_once"] == [1, 1], dict(round_trips)
        # concurrent starts share a transaction: each is refused on its own
        burst = await asyncio.gather(
            *(engine.start(w.linear, {"n": i}) for i in range(6)), return_exceptions=True
        )
        assert all(isinstance(r, WorkflowDrainedError) for r in burst), burst
        assert await row_counts(engine) == before  # nothing written, nothing half-written

        await engine.drain([w.linear.id], None)
        round_trips.clear()
        runs = await asyncio.gather(*(engine.start(w.linear, {"n": i}) for i in range(6)))
        infos = [await engine.wait(r.id, timeout=30) for r in runs]
        assert [i.status for i in infos] == ["completed"] * 6
        assert [i.output for i in infos] == [{"result": 2 * i + 3} for i in range(6)]
        if engine.kernel.db.is_postgres:
            # the creations, alone or shared, each in one round trip again
            assert set(round_trips["_create_run_once"]) == {1}, dict(round_trips)
