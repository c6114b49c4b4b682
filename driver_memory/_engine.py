"""MemoryEngine: a NativeEngine whose database lives in a temporary folder for its lifetime."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from driver_native import NativeEngine
from engine_port import BlobStore, Clock, EngineSettings, EventSink, MemoryBlobStore, Registry
from engine_port.driver import SecretUrl, UnsupportedFeatureError

__all__ = ["MemoryEngine", "create_memory_engine"]


class MemoryEngine(NativeEngine):
    """The native driver on a private SQLite file deleted on close; blobs in memory."""

    driver_name = "memory"

    def __init__(
        self,
        settings: EngineSettings,
        registry: Registry,
        *,
        event_sink: EventSink | None = None,
        blob_store: BlobStore | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            settings,
            registry,
            event_sink=event_sink,
            blob_store=blob_store if blob_store is not None else MemoryBlobStore(),
            clock=clock,
        )
        self._folder: Path | None = None

    @property
    def folder(self) -> Path | None:
        """The temporary folder holding the database while connected (None otherwise)."""
        return self._folder

    async def connect(self) -> None:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="wfe-memory-"))
            url = SecretUrl(f"sqlite:///{self._folder / 'wfe.db'}")
            self.settings = self.settings.model_copy(update={"database_url": url})
        await super().connect()

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None


def create_memory_engine(
    settings: EngineSettings,
    registry: Registry,
    *,
    event_sink: EventSink | None = None,
    blob_store: BlobStore | None = None,
    clock: Clock | None = None,
    **options: Any,
) -> MemoryEngine:
    """The factory of the ``memory`` entry point in the ``wfe.drivers`` group."""
    if options:
        raise UnsupportedFeatureError(
            f"the memory driver does not support the options {sorted(options)}"
        )
    return MemoryEngine(
        settings, registry, event_sink=event_sink, blob_store=blob_store, clock=clock
    )
