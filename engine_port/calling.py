"""What an application that runs workflows uses: building an engine from settings, the run,
stage, event and version models it returns, the event sinks, blob stores and clocks it may
pass in, migration between drivers, and metrics for a worker it hosts.

Every name here is also importable from ``engine_port``: ``from engine_port import
create_engine``. The errors are in ``engine_port.errors``; ``EngineError`` is their base.
"""

from ._blobs import DEFAULT_SPILL_THRESHOLD, BlobStore, FolderBlobStore, MemoryBlobStore
from ._blobstores import open_blob_store
from ._clock import Clock, FakeClock, SystemClock
from ._config import load_settings
from ._engine import WorkflowEngine
from ._events import EventSink, JsonlFileSink, MemorySink, open_event_sink
from ._factory import create_engine
from ._metrics import EngineMetrics, attach_metrics, serve_metrics
from ._migration import (
    MigrationReport,
    RunMove,
    abort_migration,
    copy_blobs,
    migrate_run,
    migrate_runs,
)
from ._models import (
    ErrorInfo,
    Event,
    FlushResult,
    RunInfo,
    RunSnapshot,
    RunStatus,
    SignalResult,
    StageInfo,
    StageStatus,
    VersionInfo,
)
from ._routing import RoutingEngine
from ._secrets import SecretUrl, redact_url
from ._settings import EngineSettings
from .errors import EngineError

__all__ = [
    "DEFAULT_SPILL_THRESHOLD",
    "BlobStore",
    "Clock",
    "EngineError",
    "EngineMetrics",
    "EngineSettings",
    "ErrorInfo",
    "Event",
    "EventSink",
    "FakeClock",
    "FlushResult",
    "FolderBlobStore",
    "JsonlFileSink",
    "MemoryBlobStore",
    "MemorySink",
    "MigrationReport",
    "RoutingEngine",
    "RunInfo",
    "RunMove",
    "RunSnapshot",
    "RunStatus",
    "SecretUrl",
    "SignalResult",
    "StageInfo",
    "StageStatus",
    "SystemClock",
    "VersionInfo",
    "WorkflowEngine",
    "abort_migration",
    "attach_metrics",
    "copy_blobs",
    "create_engine",
    "load_settings",
    "migrate_run",
    "migrate_runs",
    "open_blob_store",
    "open_event_sink",
    "redact_url",
    "serve_metrics",
]
