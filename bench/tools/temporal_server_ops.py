"""``python -m bench.tools.temporal_server_ops [--runs N]``: what the Temporal dev server does
per run of the bench's throughput workload (3-stage runs started 50 at a time, two worker
processes), for the driver and for the same workflow written by hand with temporalio, each on
a fresh dev server started with ``--metrics-port``: the per-run difference of its Prometheus
counters ``persistence_requests``, ``visibility_persistence_requests``, ``service_requests``
and ``task_requests`` by operation, where the two differ.

This is how the throughput's extra server CPU was attributed (bench/README.md, 2026-12-02
10:07-12:00): each visibility upsert of the dev server (a memo or search-attribute write in
a workflow task other than the last) also costs ~4 ``GetCurrentClusterMetadata`` and ~2
``GetNamespace`` persistence reads."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import sys
import tempfile
import urllib.request
import uuid
from collections import Counter
from typing import Any

from driver_temporal import TemporalDevServer
from engine_port import EngineSettings, create_engine

from .. import _temporal_raw as raw
from .. import _workflows as W
from .._procs import worker_processes
from .._temporal import _gather_bounded

_COUNTERS = (
    "persistence_requests",
    "visibility_persistence_requests",
    "service_requests",
    "task_requests",
)
_LINE = re.compile(r"^(\w+)\{(.*)\}\s+(\S+)$")
_OPERATION = re.compile(r'operation="([^"]*)"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _MetricsServer(TemporalDevServer):
    """The dev server with its Prometheus endpoint on a free port."""

    def __init__(self) -> None:
        super().__init__(headless=True)
        self.metrics_port = _free_port()

    def command(self) -> list[str]:
        return [*super().command(), "--metrics-port", str(self.metrics_port)]

    def counters(self) -> Counter[tuple[str, str]]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        out: Counter[tuple[str, str]] = Counter()
        for line in text.splitlines():
            m = _LINE.match(line)
            if m is None or m.group(1) not in _COUNTERS:
                continue
            op = _OPERATION.search(m.group(2))
            out[(m.group(1), op.group(1) if op else "")] += float(m.group(3))
        return out


async def _driver(n: int, settle: float) -> Counter[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as d:
        blobs = f"file://{d}/blobs"
        async with _MetricsServer() as server:
            settings = EngineSettings(
                driver="temporal",
                temporal_address=server.address,
                blob_url=blobs,
                task_queue="bench",
            )
            async with create_engine(settings, W.registry()) as engine:
                args = {"address": server.address, "blobs": blobs}
                async with worker_processes("temporal-driver", args):
                    await asyncio.sleep(settle)
                    before = server.counters()
                    runs = await _gather_bounded(n, 50, lambda _i: engine.start("bench-seq3", {}))
                    await _gather_bounded(n, 100, lambda i: engine.wait(runs[i].id, timeout=600))
                    await asyncio.sleep(1.0)
                    return server.counters() - before


async def _hand_written(n: int, settle: float) -> Counter[tuple[str, str]]:
    from temporalio.client import Client

    async with _MetricsServer() as server:
        client = await Client.connect(server.address)
        async with worker_processes("temporal-raw", {"address": server.address}):
            await asyncio.sleep(settle)
            before = server.counters()

            async def start(_i: int) -> Any:
                return await client.start_workflow(
                    "bench_seq3", False, id=uuid.uuid4().hex, task_queue=raw.TASK_QUEUE
                )

            handles = await _gather_bounded(n, 50, start)
            await _gather_bounded(n, 100, lambda i: handles[i].result())
            await asyncio.sleep(1.0)
            return server.counters() - before


async def main(n: int, settle: float) -> None:
    drv = await _driver(n, settle)
    hand = await _hand_written(n, settle)
    print(f"per run ({n} runs each): counter, operation, driver, hand-written")
    for key in sorted(set(drv) | set(hand)):
        d, h = drv.get(key, 0.0) / n, hand.get(key, 0.0) / n
        if abs(d - h) >= 0.05:
            print(f"  {key[0]:32s} {key[1]:40s} {d:7.2f} {h:7.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--settle", type=float, default=10.0)
    args = ap.parse_args()
    asyncio.run(main(args.runs, args.settle))
    # (the bare temporalio client of the hand-written side can abort the interpreter's
    # finalization, sdk-python#300: the figures are printed, leave without it)
    sys.stdout.flush()
    os._exit(0)
