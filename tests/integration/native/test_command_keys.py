"""Idempotency keys for kernel commands: a repeat returns the first result, a repeat while the
first still runs raises CommandInProgressError, a key left in progress past
command_key_stale_seconds is reclaimed (FakeClock), and a stale holder's late failure does not
erase the reclaimer's result."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from driver_native import CreateRun, SignalStep
from engine_port import FakeClock, MemoryBlobStore, SignalResult
from engine_port.errors import CommandInProgressError, IdempotencyConflictError

from . import workflows as w
from .conftest import MakeEngine, count_rows


class GatedStore(MemoryBlobStore):
    """A blob store whose puts wait for a gate: holds a CreateRun (with a spilled input)
    in progress for as long as a test needs."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def put(self, key: str, data: bytes) -> None:
        if not self.entered.is_set():  # only the first put is held
            self.entered.set()
            await self.gate.wait()
        await super().put(key, data)


async def test_repeat_returns_first_result(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.waiter)
    k = engine.kernel
    first = await k.dispatch(CreateRun("it-waiter", {"n": 1}), idempotency_key="create-1")
    again = await k.dispatch(CreateRun("it-waiter", {"n": 1}), idempotency_key="create-1")
    assert again == first
    assert await count_rows(engine, "wfe_runs") == 1
    run_id = first[0]
    sig = await k.dispatch(SignalStep(run_id, "go", {"x": 1}), idempotency_key="sig-1")
    sig2 = await k.dispatch(SignalStep(run_id, "go", {"x": 1}), idempotency_key="sig-1")
    assert isinstance(sig, SignalResult) and not sig.delivered  # buffered: nothing waits yet
    assert sig2 == sig  # the stored first result, not a second delivery
    assert await count_rows(engine, "wfe_signal_queue", run_id=run_id) == 1
    with pytest.raises(IdempotencyConflictError):
        await k.dispatch(SignalStep(run_id, "go", {"x": 2}), idempotency_key="sig-1")


async def test_in_progress_guard_and_stale_reclaim(make_engine: MakeEngine) -> None:
    clock = FakeClock()
    store = GatedStore()
    engine = await make_engine(
        w.linear,
        clock=clock,
        blob_store=store,
        spill_threshold_bytes=16,
        command_key_stale_seconds=600,
    )
    k = engine.kernel
    cmd = CreateRun("it-linear", {"n": 1, "note": "x" * 64})
    holder = asyncio.create_task(k.dispatch(cmd, idempotency_key="slow-create"))
    try:
        await asyncio.wait_for(store.entered.wait(), 5)
        with pytest.raises(CommandInProgressError):
            await k.dispatch(cmd, idempotency_key="slow-create")
        clock.advance(599)
        with pytest.raises(CommandInProgressError):
            await k.dispatch(cmd, idempotency_key="slow-create")
        clock.advance(2)  # the holder is presumed dead now
        reclaimed: Any = await k.dispatch(cmd, idempotency_key="slow-create")
        assert reclaimed[1] is True
    finally:
        holder.cancel()  # the stale holder fails late, after the reclaimer finished
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await holder
    assert await count_rows(engine, "wfe_runs") == 1
    repeat = await k.dispatch(cmd, idempotency_key="slow-create")
    assert repeat == reclaimed
    assert await count_rows(engine, "wfe_runs") == 1
    assert await count_rows(engine, "wfe_command_keys", status="done") == 1


async def test_failed_command_leaves_no_key(make_engine: MakeEngine) -> None:
    engine = await make_engine(w.linear)
    with pytest.raises(Exception):  # noqa: B017 - WorkflowNotFoundError
        await engine.kernel.dispatch(CreateRun("nope", {}), idempotency_key="bad")
    assert await count_rows(engine, "wfe_command_keys") == 0
    first = await engine.kernel.dispatch(CreateRun("it-linear", {"n": 1}), idempotency_key="bad")
    assert first[1] is True
