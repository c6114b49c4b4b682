"""The per-engine waiters through which a worker's signal handler answers ``signal()`` in
process (``driver_temporal._waiters``): resolved from the workflow's thread, never raising
into the workflow, and only for the deliveries the engine waits for."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

from temporalio.worker import WorkflowInterceptorClassInput

from driver_temporal._activities import DriverActivities
from driver_temporal._names import DELIVERY_DECIDED, RUN_ENDED
from driver_temporal._run_end import RunEnds, WorkerExterns
from driver_temporal._waiters import DeliveryWaiters


async def test_a_decision_from_another_thread_resolves_the_waiter_on_its_loop() -> None:
    waiters = DeliveryWaiters()
    fut = waiters.expect("d1")
    decision = {"delivered": True, "already_completed": False}
    t = threading.Thread(target=waiters.decided, args=("d1", decision))
    t.start()
    t.join()
    assert await asyncio.wait_for(fut, 5) == decision
    decision["delivered"] = False  # the workflow's own dict: the engine got a copy
    assert fut.result()["delivered"] is True
    waiters.forget("d1")
    assert len(waiters) == 0


async def test_unknown_forgotten_or_malformed_decisions_are_ignored() -> None:
    waiters = DeliveryWaiters()
    fut = waiters.expect("d1")
    waiters.decided("other", {"delivered": True})  # another engine's delivery
    waiters.decided(None, {"delivered": True})
    waiters.decided("d1", "not a dict")
    await asyncio.sleep(0.01)
    assert not fut.done()
    waiters.forget("d1")
    waiters.decided("d1", {"delivered": True})  # too late: signal() gave up on it
    await asyncio.sleep(0.01)
    assert not fut.done()


def test_a_decision_for_a_closed_loop_does_not_raise() -> None:
    waiters = DeliveryWaiters()
    loop = asyncio.new_event_loop()

    async def expect() -> asyncio.Future[dict[str, Any]]:
        return waiters.expect("d1")

    fut = loop.run_until_complete(expect())
    loop.close()
    waiters.decided("d1", {"delivered": True})  # the caller's loop is gone
    assert not fut.done()


async def test_a_cancelled_waiter_is_not_resolved() -> None:
    waiters = DeliveryWaiters()
    fut = waiters.expect("d1")
    fut.cancel()
    waiters.decided("d1", {"delivered": True})
    await asyncio.sleep(0.01)
    assert fut.cancelled()


async def test_the_interceptor_gives_its_worker_the_engines_extern_functions() -> None:
    a, b = DeliveryWaiters(), DeliveryWaiters()
    ends = RunEnds(cast(DriverActivities, None))  # (its record() is not called here)
    externs: dict[str, Any] = {}
    assert (
        WorkerExterns(a, ends).workflow_interceptor_class(
            WorkflowInterceptorClassInput(unsafe_extern_functions=externs)
        )
        is None
    )
    assert externs[DELIVERY_DECIDED] == a.decided
    assert callable(externs[RUN_ENDED])
    other: dict[str, Any] = {}
    WorkerExterns(b, ends).workflow_interceptor_class(
        WorkflowInterceptorClassInput(unsafe_extern_functions=other)
    )
    assert other[DELIVERY_DECIDED] == b.decided and other[DELIVERY_DECIDED] != a.decided


async def test_many_waiters_each_get_their_own_decision() -> None:
    waiters, n = DeliveryWaiters(), 3
    futs = {f"d{i}": waiters.expect(f"d{i}") for i in range(n)}
    for i in reversed(range(n)):
        waiters.decided(f"d{i}", {"i": i})
    for i in range(n):
        assert (await futs[f"d{i}"])["i"] == i
