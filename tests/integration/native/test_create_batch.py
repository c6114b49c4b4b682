"""Concurrent start() calls share a write transaction while one is in flight (group
commit, ``driver_native/_batch.py``); a failing creation in a batch fails alone."""

from __future__ import annotations

import asyncio
from collections import Counter

from driver_native._commands import CreateRun
from engine_port.errors import RunExistsError

from . import workflows as w
from .conftest import MakeEngine


async def test_concurrent_starts_share_transactions(
    make_engine: MakeEngine, transactions: Counter[str]
) -> None:
    engine = await make_engine(w.linear)
    runs = await asyncio.gather(*(engine.start(w.linear, {"n": i}) for i in range(20)))
    assert len({r.id for r in runs}) == 20
    # the first alone, the 19 that queued meanwhile together (before: 20 transactions)
    assert transactions["_create_run_once"] == 1 and transactions["_each"] == 1, transactions
    for i, r in enumerate(runs):
        info = await engine.get_run(r.id)
        assert info.status == "pending" and info.input["n"] == i


async def test_a_failing_creation_in_a_batch_fails_alone(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear)
    taken = await engine.start(w.linear, {"n": 0})
    kernel = engine.kernel
    results = await asyncio.gather(
        *(
            kernel.dispatch(
                CreateRun(w.linear.id, {"n": i}, run_id=taken.id if i == 3 else f"run-{i}")
            )
            for i in range(6)
        ),
        return_exceptions=True,
    )
    assert isinstance(results[3], RunExistsError)
    assert [r for i, r in enumerate(results) if i != 3] == [
        (f"run-{i}", True) for i in range(6) if i != 3
    ]
    assert (await engine.get_run(taken.id)).input["n"] == 0  # not overwritten
