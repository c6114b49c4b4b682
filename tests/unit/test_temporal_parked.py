"""Parked events as the Temporal driver reads them: batches and single events (parked by an
older worker), overlapping, come back in sequence order, each id once."""

from __future__ import annotations

import pydantic_core

from driver_temporal._activities import in_order, parked_events
from driver_temporal._wire import outbox_batch_key, outbox_key
from engine_port import MemoryBlobStore


def _event(seq: int) -> dict[str, object]:
    return {"id": f"e{seq}", "run_id": "r1", "seq": seq, "type": "stage.started"}


async def test_batches_and_single_events_read_back_in_order_once() -> None:
    store = MemoryBlobStore()
    await store.put(outbox_key("r1", 1, "e1"), pydantic_core.to_json(_event(1)))
    await store.put(
        outbox_batch_key("r1", 2, 4), pydantic_core.to_json([_event(s) for s in (2, 3, 4)])
    )
    await store.put(
        outbox_batch_key("r1", 3, 5), pydantic_core.to_json([_event(s) for s in (3, 4, 5)])
    )
    keys = await store.list("outbox/r1/")
    assert len(keys) == 3
    events = in_order(await parked_events(store, keys))
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
