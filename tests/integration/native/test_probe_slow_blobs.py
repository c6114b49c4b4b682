"""A slow blob store never lets an attempt's lease lapse while its worker is still at it.

Found by a multi-process probe (PostgreSQL + S3, several ``wfe worker`` processes): the write
of a spilled stage output and the reads of a stage's spilled input and upstream outputs ran
outside the attempt's heartbeats. A blob call slower than the lease (a large value, a
struggling S3, an S3 that accepts connections but does not answer) let the lease expire; the
reaper re-queued the job and a claim ran the stage body a second time beside the first, while
the first worker was alive and still storing its result.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from engine_port import MemoryBlobStore, RunStatus, StageContext, Workflow

from .conftest import MakeEngine

BIG = 3000  # characters: over the spill threshold the tests set
SLOW = 5.0  # seconds a slow blob call takes: more than twice the lease
# (a 1 s lease lapsed beside a CPU hog, the event loop of a SQLite worker held ~0.7 s between
# two heartbeats, and the stage ran twice: the test is about the blob call, not a starved loop)
LEASE = 2.0

RAN: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


class In(BaseModel):
    pad: str = ""


def _workflow() -> Workflow[In]:
    wf = Workflow("probe-slow-blobs", input=In)

    @wf.stage
    async def first(ctx: StageContext[In]) -> str:
        RAN["first"] += 1
        return "x" * BIG

    @wf.stage(after=[first])
    async def second(ctx: StageContext[In]) -> int:
        RAN["second"] += 1
        return len(str(ctx.output_of(first))) + len(ctx.input.pad)

    return wf


class SlowOnce(MemoryBlobStore):
    """The first write (or read) of a key containing ``part`` takes ``SLOW`` seconds."""

    def __init__(self, *, put_part: str | None = None, get_part: str | None = None) -> None:
        super().__init__()
        self.put_part, self.get_part = put_part, get_part
        self.slowed: list[str] = []

    async def _slow(self, key: str, part: str | None) -> None:
        if part is not None and part in key and not any(part in k for k in self.slowed):
            self.slowed.append(key)
            await asyncio.sleep(SLOW)

    async def put(self, key: str, data: bytes) -> None:
        await self._slow(key, self.put_part)
        await super().put(key, data)

    async def get(self, key: str) -> bytes:
        await self._slow(key, self.get_part)
        return await super().get(key)


async def _run(
    make_engine: MakeEngine, store: SlowOnce, pad: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="wfe.kernel")
    engine = await make_engine(
        _workflow(), blob_store=store, spill_threshold_bytes=1000, lease_seconds=LEASE
    )
    async with engine.worker(maintenance_interval=0.05, poll_interval=0.02):
        run = await engine.start("probe-slow-blobs", {"pad": pad})
        info = await engine.wait(run.id, timeout=60)
    assert store.slowed, "the slow blob call never happened"
    assert info.status == RunStatus.COMPLETED, info.error
    assert info.output == BIG + len(pad)
    assert dict(RAN) == {"first": 1, "second": 1}
    attempts = {s.id: s.attempt for s in info.stages}
    assert attempts == {"first": 1, "second": 1}
    # (a stage taken over while its first claim still loads its input would run twice, the
    # second time after the run completed: no lease may have lapsed at all)
    lapsed = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert not lapsed


async def test_a_slow_write_of_a_stage_output_keeps_the_lease(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    await _run(make_engine, SlowOnce(put_part="/stages/first/output-"), "", caplog)


async def test_a_slow_read_of_an_upstream_output_keeps_the_lease(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    # (the second stage reads the first stage's spilled output before its body runs)
    await _run(make_engine, SlowOnce(get_part="/stages/first/output-"), "", caplog)


async def test_a_slow_read_of_a_spilled_run_input_keeps_the_lease(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    await _run(make_engine, SlowOnce(get_part="/input-"), "p" * BIG, caplog)
