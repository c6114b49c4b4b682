"""One WARNING per outage of the blob store, also while runs that never touch it go on.

The kernel ended an outage ("the engine's storage answers again") at the next attempt that
went through, whatever it was: an attempt of a run with no spilled value completes while the
S3 server is still down, so the INFO was false and the next abandoned attempt logged a second
WARNING: a WARNING + INFO pair per such completion for as long as the outage lasted."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from driver_native import ClaimPending, ExecuteJob, _schema
from driver_native._engine import NativeEngine
from engine_port import MemoryBlobStore, StageContext, Workflow
from engine_port.errors import DriverUnavailableError

from .conftest import MakeEngine


class In(BaseModel):
    doc: str = ""


class _FlakyStore(MemoryBlobStore):
    """A blob store whose reads fail while ``down`` (an S3 server that does not answer)."""

    down = False

    async def get(self, key: str) -> bytes:
        if self.down:
            raise DriverUnavailableError("S3 blob store at http://s3:9000 failed: cannot connect")
        return await super().get(key)


async def _run_due(engine: NativeEngine) -> list[str]:
    results = []
    while jobs := await engine.kernel.dispatch(ClaimPending("w", limit=1)):
        results.append(await engine.kernel.dispatch(ExecuteJob(jobs[0], "w")))
    return results


async def _make_due(engine: NativeEngine) -> None:
    def q(conn: sa.Connection) -> None:
        conn.execute(sa.update(_schema.jobs).values(available_at=0))

    await engine.kernel.db.tx(q)


async def test_an_outage_ends_when_an_attempt_that_needs_the_store_goes_through(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wfe.kernel")
    wf: Workflow[In] = Workflow("ops-outage-log", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> Any:
        return len(ctx.input.doc)

    store = _FlakyStore()
    engine = await make_engine(wf, blob_store=store, spill_threshold_bytes=1000)
    big = await engine.start(wf.id, {"doc": "y" * 5000})  # its input is spilled
    store.down = True
    assert await _run_due(engine) == ["abandoned"]
    small = []
    for _ in range(2):  # runs without a spilled value go on meanwhile
        small.append(await engine.start(wf.id, {"doc": "z"}))
        await _make_due(engine)
        assert sorted(await _run_due(engine)) == ["abandoned", "completed"]
    store.down = False
    await _make_due(engine)
    assert await _run_due(engine) == ["completed"]
    for run in [big, *small]:
        assert (await engine.get_run(run.id)).status == "completed"

    kernel = [r for r in caplog.records if r.name == "wfe.kernel"]
    warned = [r.getMessage() for r in kernel if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "is abandoned" in warned[0], warned
    back = [r.getMessage() for r in kernel if r.levelno == logging.INFO]
    assert back == ["the engine's storage answers again: 3 attempt(s) were abandoned meanwhile"]
