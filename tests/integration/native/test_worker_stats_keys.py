"""``worker.stats()`` has every key it documents from the start, each counter 0 until it counts
something: a dashboard or a script reading ``stats()["completed"]`` of a fresh worker gets 0,
not a KeyError."""

from __future__ import annotations

import re

from driver_native._worker import COUNTERS, JOB_RESULTS, WorkerHost

from .conftest import MakeEngine, eventually
from .workflows import linear

OTHER_KEYS = {
    "worker_id",
    "running",
    "uptime_s",
    "outbox_pending",
    "outbox_retrying",
    "outbox_dead",
    "sync_threads",
    "sync_abandoned_running",
    "sync_abandoned_total",
    "database_retries",
    "database_outages",
}


def _documented() -> set[str]:
    doc = WorkerHost.stats.__doc__ or ""
    return set(re.findall(r"``([a-z_]+)``", doc)) - {
        "maintenance_interval",
        "replay_dlq",
        "_survey",
    }


def test_the_docstring_lists_every_key() -> None:
    assert set(JOB_RESULTS) <= set(COUNTERS)
    assert len(COUNTERS) == len(set(COUNTERS))
    assert _documented() == set(COUNTERS) | OTHER_KEYS


async def test_a_fresh_worker_reports_every_counter_as_zero(make_engine: MakeEngine) -> None:
    engine = await make_engine(linear)
    fresh = WorkerHost(engine.kernel).stats()  # made, not started
    assert set(fresh) == _documented()
    assert {k: fresh[k] for k in COUNTERS} == dict.fromkeys(COUNTERS, 0)
    assert fresh["completed"] == 0 and fresh["abandoned"] == 0

    async with engine.worker() as host:
        started = host.stats()
        assert set(started) == _documented()
        assert started["completed"] == 0 and started["failed"] == 0
        run = await engine.start(linear, {"n": 1})
        assert (await engine.wait(run.id, timeout=30)).status == "completed"

        async def three() -> bool:
            return host.stats()["completed"] == 3  # one per stage of a -> b -> c

        await eventually(three)
        after = host.stats()
        assert set(after) == _documented()  # counting adds no key
        assert after["failed"] == 0 and after["abandoned"] == 0
