"""``python -m bench.tools.temporal_reads [--calls N]``: the client CPU of reading a finished
run, the way the Temporal driver did before tcpu (``WorkflowHandle.describe()`` then
``desc.memo()``; ``handle.result(follow_runs=True)`` as the close poll) and the way it does now
(``_describe_raw`` + ``_memo_of``; ``_helpers._settle``), interleaved in one process against
one dev server, so that the machine's load hits both alike. Process CPU (``time.process_time``:
every thread, the SDK core's included) per call; both make the same RPC."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from driver_temporal._helpers import _settle

from ._temporal_engine import driver_engine


async def _compare(
    name: str, old: Callable[[], Awaitable[Any]], new: Callable[[], Awaitable[Any]], calls: int
) -> None:
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(calls):
        order = (("old", old), ("new", new)) if i % 2 else (("new", new), ("old", old))
        for label, call in order:
            c = time.process_time()
            await call()
            cpu[label].append(time.process_time() - c)
    print(
        f"{name}: before {statistics.mean(cpu['old']) * 1000:.3f} ms CPU/call, now "
        f"{statistics.mean(cpu['new']) * 1000:.3f} ms CPU/call ({calls} each, interleaved)"
    )


async def main(calls: int) -> None:
    async with driver_engine() as (engine, _server):
        run = await engine.start("bench-seq3", {})
        await engine.wait(run.id, timeout=60)
        handle = engine._conn.get_workflow_handle(run.id)

        async def old_describe() -> Any:
            desc = await handle.describe()
            return await desc.memo(), desc.status

        async def new_describe() -> Any:
            return await engine._memo_of(await engine._describe_raw(run.id))

        async def old_poll() -> None:
            with contextlib.suppress(Exception):  # (as the driver's _settle did)
                await handle.result(follow_runs=True)

        async def new_poll() -> None:
            await _settle(engine._conn, run.id)

        await _compare("describe + memo", old_describe, new_describe, calls)
        await _compare("close poll", old_poll, new_poll, calls)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=300)
    asyncio.run(main(ap.parse_args().calls))
