"""``wait()`` for runs that workers in other processes execute: every wait of an engine
shares one status query per tick, so a process waiting for many runs (an API server awaiting
its requests' runs) does not load the database in proportion to them."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from driver_native import Database

from . import workflows as w
from .conftest import MakeEngine


async def test_many_waits_for_runs_executed_elsewhere_share_their_status_reads(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    caller = await make_engine(w.linear)  # starts runs and waits; no worker of its own
    runner = await make_engine(w.linear)  # another process: the worker
    runs = [await caller.start(w.linear, {"n": i}) for i in range(200)]
    reads: Counter[str] = Counter()
    original = Database._read_once

    def counting(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        if self is caller.kernel.db:
            reads[getattr(fn, "__name__", repr(fn))] += 1
        return original(self, attempt, fn, *a, **k)

    monkeypatch.setattr(Database, "_read_once", counting)
    began = time.monotonic()
    waits = [asyncio.create_task(caller.wait(run.id, timeout=120)) for run in runs]
    await asyncio.sleep(1.0)  # nobody runs them yet: the waits look and look
    async with runner.worker():
        infos = await asyncio.gather(*waits)
    elapsed = time.monotonic() - began
    assert [i.status for i in infos] == ["completed"] * len(runs)
    assert [i.output for i in infos] == [{"result": 2 * i + 3} for i in range(len(runs))]
    looks = reads["run_status"] + reads["run_statuses"]
    # one read per wait to begin with, then at most one shared look per 10 ms tick (here
    # twice that, for slack); each wait looking on its own made ~10 reads a second per run
    assert looks <= len(runs) + 200 * elapsed, f"{dict(reads)} in {elapsed:.1f}s"
