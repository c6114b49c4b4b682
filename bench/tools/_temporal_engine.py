"""The Temporal driver as the Temporal profiling tools run it: a fresh headless dev server,
blobs in a temporary folder, task queue ``bench``, an in-process worker."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator

from driver_temporal import TemporalDevServer, TemporalEngine
from engine_port import EngineSettings, Registry, create_engine

from .. import _workflows as W


@contextlib.asynccontextmanager
async def driver_engine(
    *, worker: bool = True, registry: Registry | None = None
) -> AsyncIterator[tuple[TemporalEngine, TemporalDevServer]]:
    """(the engine with its worker running unless ``worker=False``, the dev server it talks
    to); the bench's workflows unless ``registry`` names others."""
    with tempfile.TemporaryDirectory() as d:
        async with TemporalDevServer(headless=True) as server:
            settings = EngineSettings(
                driver="temporal",
                temporal_address=server.address,
                blob_url=f"file://{d}/blobs",
                task_queue="bench",
            )
            async with create_engine(settings, registry or W.registry()) as engine:
                assert isinstance(engine, TemporalEngine)
                if not worker:
                    yield engine, server
                    return
                async with engine.worker():
                    yield engine, server
