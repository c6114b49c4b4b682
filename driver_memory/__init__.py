"""The memory driver: the native driver on a private, throwaway store, for fast unit tests.

``EngineSettings(driver="memory")`` builds a native engine on an SQLite file in a temporary
folder made when the engine connects and deleted when it closes, with blobs in memory
(``MemoryBlobStore``) unless a ``blob_store`` is passed. Nothing is shared: another engine,
a worker process or the CLI never sees its runs, so run the worker in the same process
(``async with engine, engine.worker():``). ``database_url`` and ``blob_url`` are ignored.
"""

from ._engine import MemoryEngine, create_memory_engine

__all__ = ["MemoryEngine", "create_memory_engine"]
