"""Stage outcomes that arrive while another one's transaction is in flight share the next
transaction (``_batch.TxBatcher``): a fan-out's siblings finishing together are recorded in
a few transactions instead of one each, every outcome is applied once with the run's events
in order, and when a shared transaction fails each outcome is recorded alone."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from driver_native import _batch, _kernel, _progress
from driver_native._db import Database

from .conftest import MakeEngine
from .test_wide_graphs import fan

WIDTH = 30


@pytest.fixture
def outcome_transactions(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Committed outcome transactions: ``single`` (one outcome) and ``shared`` (several)."""
    seen: Counter[str] = Counter()
    original = Database._tx_once

    def counting(self: Database, attempt: Any, fn: Any, *a: Any, **k: Any) -> Any:
        result = original(self, attempt, fn, *a, **k)
        if fn is _kernel._apply_and_read:
            seen["single"] += 1
        elif getattr(fn, "__name__", "") == "_each" and a[0] is _kernel._apply_and_read:
            seen["shared"] += 1
            seen["in shared"] += len(a[1])
        return result

    monkeypatch.setattr(Database, "_tx_once", counting)
    return seen


async def _run_fan(engine: Any) -> Any:
    run = await engine.start(f"it-fan-{WIDTH}", {})
    async with engine.worker():
        info = await engine.wait(run.id, timeout=60)
    assert info.status == "completed", info
    assert info.output == WIDTH * 2 + 1
    events = await engine.events(run.id)
    completed = Counter(e.stage for e in events if e.type == "stage.completed")
    assert completed == Counter({"src": 1, "sink": 1} | {f"m{i}": 1 for i in range(WIDTH)})
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    return run


async def test_a_fan_outs_siblings_share_outcome_transactions(
    make_engine: MakeEngine, outcome_transactions: Counter[str]
) -> None:
    engine = await make_engine(fan(WIDTH), worker_concurrency=WIDTH + 2)
    await _run_fan(engine)
    # every one of the WIDTH + 2 outcomes recorded once, most of them in shared transactions
    assert outcome_transactions["single"] + outcome_transactions["in shared"] == WIDTH + 2
    assert outcome_transactions["shared"] >= 1, outcome_transactions
    assert outcome_transactions["single"] + outcome_transactions["shared"] < WIDTH, (
        outcome_transactions
    )


async def test_a_failed_shared_transaction_records_each_outcome_alone(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = await make_engine(fan(WIDTH), worker_concurrency=WIDTH + 2)
    original, each = _progress.apply_outcome, _batch._each
    shared: list[bool] = []  # set while a shared transaction runs
    failed: list[str] = []

    def sharing(*a: Any) -> Any:
        shared.append(True)
        try:
            return each(*a)
        finally:
            shared.pop()

    def fails_once_when_shared(conn: Any, job: Any, *a: Any, **k: Any) -> Any:
        if shared and not failed:
            failed.append(job.stage_id)
            raise RuntimeError("one outcome of the shared transaction fails")
        return original(conn, job, *a, **k)

    monkeypatch.setattr(_batch, "_each", sharing)
    monkeypatch.setattr(_progress, "apply_outcome", fails_once_when_shared)
    await _run_fan(engine)  # every outcome applied once, the run right
    assert failed, "no outcome was recorded in a shared transaction"
