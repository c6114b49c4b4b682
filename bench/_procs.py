"""Worker processes for the throughput workload (two per system), started and stopped by
the measuring process. ``python -m bench._procs <kind> <json args>`` prints READY once it
serves work and runs until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["worker_processes"]


@contextlib.asynccontextmanager
async def worker_processes(kind: str, args: dict[str, Any], count: int = 2) -> AsyncIterator[None]:
    """Start ``count`` worker processes of ``kind`` and wait until each prints READY."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(_spawn(kind, args))
        for p in procs:
            assert p.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(p.stdout.readline), 60)
            if b"READY" not in line:
                raise RuntimeError(f"{kind} worker process did not start (exit {p.poll()})")
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.to_thread(p.wait, 15)
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
        for p in procs:
            if p.returncode not in (0, -signal.SIGKILL):
                # (after its work: the measurement stands, but an exit crash is worth a line)
                print(f"bench: a {kind} worker process exited with {p.returncode}", file=sys.stderr)


def _spawn(kind: str, args: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench._procs", kind, json.dumps(args)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def _until_term() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("READY", flush=True)
    await stop.wait()


async def _native(a: dict[str, Any]) -> None:
    from engine_port import EngineSettings, create_engine

    from ._workflows import registry

    settings = EngineSettings(driver="native", database_url=a["db"], blob_url=a["blobs"])
    async with create_engine(settings, registry()) as engine, engine.worker():
        await _until_term()


async def _temporal_driver(a: dict[str, Any]) -> None:
    from engine_port import EngineSettings, create_engine

    from ._workflows import registry

    settings = EngineSettings(
        driver="temporal", temporal_address=a["address"], blob_url=a["blobs"], task_queue="bench"
    )
    async with create_engine(settings, registry()) as engine, engine.worker():
        await _until_term()


async def _temporal_raw(a: dict[str, Any]) -> None:
    from . import _temporal_raw

    async with _temporal_raw.worker(a["address"], pinned=bool(a.get("pinned"))):
        await _until_term()


def _dbos(a: dict[str, Any]) -> None:
    from . import _dbos_app

    _dbos_app.launch(a["url"], listen=True)
    _dbos_app.register_queue()
    time.sleep(1.5)  # DBOS picks up a newly registered queue within its 1 s refresh
    print("READY", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    _dbos_app.shutdown()


def main() -> None:
    kind, raw = sys.argv[1], sys.argv[2]
    a = json.loads(raw)
    if kind == "native":
        asyncio.run(_native(a))
    elif kind == "temporal-driver":
        asyncio.run(_temporal_driver(a))
    elif kind == "temporal-raw":
        asyncio.run(_temporal_raw(a))
    elif kind == "dbos":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        _dbos(a)
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


if __name__ == "__main__":
    main()
