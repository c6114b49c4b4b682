"""Record ``local_clock_<shape>.json`` for ``test_local_clock.py``: ``PYTHONPATH=<tree> python
record_local_clock.py reported|running OUT`` records on the code of <tree> (its own Temporal dev
server) a run of ``test_local_clock.query_flow(shape)`` whose first workflow task a query came
with, split by it that way (``test_local_clock.split_task``), with the events the run's sink
received. Runs that split otherwise are run again.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path

from driver_temporal import create_temporal_engine
from driver_temporal._names import RUN_INFO_QUERY
from engine_port import EngineSettings, FolderBlobStore, MemorySink, Registry
from tests.integration.temporal.conftest import wait_for_event
from tests.integration.temporal.test_local_clock import query_flow, split_task
from tests.support.temporal import roomy_dev_server


async def main(shape: str, out: Path) -> None:
    server = roomy_dev_server(headless=True)
    await server.start()
    blobs = Path(tempfile.mkdtemp())
    try:
        for _ in range(20):
            sink = MemorySink()
            settings = EngineSettings(
                driver="temporal",
                temporal_address=server.address,
                task_queue=f"h-{uuid.uuid4().hex[:8]}",
                blob_url=f"file://{blobs}",
            )
            engine = create_temporal_engine(
                settings,
                Registry([query_flow(shape)]),
                event_sink=sink,
                blob_store=FolderBlobStore(blobs),
            )
            async with engine:
                run = await engine.start(f"local-clock-{shape}", {"n": 3})
                handle = engine._conn.get_workflow_handle(run.id)
                asked = asyncio.ensure_future(handle.query(RUN_INFO_QUERY))
                await asyncio.sleep(0.5)
                async with engine.worker():
                    await asyncio.wait_for(asked, 30)
                    info = await engine.wait(run.id, timeout=60)
                    await wait_for_event(sink, run.id, "run.completed")
                history = await handle.fetch_history()
            print(info.status, split_task(history))
            if split_task(history) == shape:
                data = {
                    "workflow_id": run.id,
                    "history": json.loads(history.to_json()),
                    "events": [e.model_dump(mode="json") for e in sink.for_run(run.id)],
                }
                out.write_text(json.dumps(data))  # noqa: ASYNC240 (a one-off script)
                return
        raise SystemExit(f"no run split {shape}")
    finally:
        await server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
