"""The Temporal workflow's signal queue bookkeeping (``driver_temporal._signals``), driven
directly: what a stage attempt is lent, and what leaves the queue when it reports."""

from __future__ import annotations

from typing import Any

from driver_temporal._signals import SignalHandlers


class _Queue(SignalHandlers):
    def __init__(self, *payloads: tuple[str, Any]) -> None:
        self._signals = [{"name": n, "payload": p, "idempotency_key": None} for n, p in payloads]
        self._lent = {}
        self._reserved = {}
        self._held = {}
        self._holder_rule = False


def test_a_resumed_wait_reserves_one_signal_nobody_else_takes() -> None:
    q = _Queue(("a", 1), ("a", 2))
    assert q._reserve("x", "a") and q._reserve("y", "a")
    assert not q._reserve("z", "a")  # two signals, two waiters: a third gets none
    assert q._lend("x", local=False) == {"a": [1]}
    assert q._lend("y", local=False) == {"a": [2]}
    q._settle_lent("x", ["a"])
    q._settle_lent("y", [])  # y did not consume its signal: it is free again
    assert [s["payload"] for s in q._signals] == [2] and q._queued("a") == 1


def test_settle_removes_the_signal_the_task_listed_first() -> None:
    """A signal put back in front of the queue (a sibling's take whose wait never completed)
    after x reserved a later one: a local x is lent both, its task lists them in queue order,
    and the one its body consumed (the first) is the one that leaves the queue."""
    q = _Queue(("a", 2))
    assert q._reserve("x", "a")
    q._held["y"] = {"wait": {"name": "a", "payload": 1, "idempotency_key": None}}
    q._release_taken("y", {})  # goes back in front of the queue
    assert q._lend("x", local=True) == {"a": [1, 2]}
    q._settle_lent("x", ["a"])  # the body took 1
    assert [s["payload"] for s in q._signals] == [2]
