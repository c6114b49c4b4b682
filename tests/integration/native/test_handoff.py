"""A run started next to a local worker goes to it without the queue: the run is created,
leased to the worker and begun in one transaction, each stage hands the next one on in the
transaction that records it, and wait() learns of the end from the worker (issue 12)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from driver_native._db import Database
from engine_port import Lifecycle

from . import workflows as w
from .conftest import MakeEngine


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Write transactions by the name of their function (autocommit reads not counted)."""
    seen: Counter[str] = Counter()
    original = Database._tx_once

    def counting(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        seen[getattr(fn, "__name__", repr(fn))] += 1
        return original(self, attempt, fn, *a, **k)

    monkeypatch.setattr(Database, "_tx_once", counting)
    return seen


async def test_a_three_stage_run_with_a_local_worker_costs_four_transactions(
    make_engine: MakeEngine, transactions: Counter[str]
) -> None:
    engine = await make_engine(w.linear)
    async with engine.worker(maintenance_interval=3600):
        warm = await engine.start(w.linear, {"n": 0})  # (the loop's first maintenance)
        assert (await engine.wait(warm.id, timeout=30)).status == "completed"
        transactions.clear()
        run = await engine.start(w.linear, {"n": 1})
        info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed" and info.output == {"result": 5}
    # create (+ lease + begin the first stage), then one per stage outcome: no claim, no begin
    assert transactions == Counter({"_create_run_once": 1, "apply_outcome": 3}), transactions
    # the same events as through the queue, in the same order
    lc = Lifecycle(run.id)
    types = [e.type for e in await engine.events(run.id)]
    assert types[:3] == ["run.created", "run.started", "stage.started"]
    assert types[-1] == "run.completed"
    assert lc.run_started().id == (await engine.events(run.id))[1].id
