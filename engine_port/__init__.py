"""engine_port: one workflow graph format, one engine API, several drivers.

Write a workflow once as a graph of durable stages; run it on the native driver (SQLite or
PostgreSQL) or on Temporal, chosen in configuration.
"""

from ._blobs import (
    DEFAULT_SPILL_THRESHOLD,
    BlobStore,
    ClaimCheck,
    FolderBlobStore,
    MemoryBlobStore,
    box_inline,
    is_spill_ref,
    run_prefix,
)
from ._blobstores import open_blob_store
from ._clock import Clock, FakeClock, SystemClock
from ._context import StageContext, Steps, SyncSteps
from ._engine import WorkflowEngine
from ._events import EventSink, JsonlFileSink, MemorySink, event_id, open_event_sink
from ._factory import create_engine
from ._graph import GraphModel, Retry, Stage, StageSpec, Workflow
from ._ledger import InMemoryLedger, StepLedger, StepRecord
from ._lifecycle import EventDraft, Lifecycle, run_output
from ._metrics import EngineMetrics, attach_metrics, serve_metrics
from ._migration import MigrationReport, RunMove, copy_blobs, migrate_run, migrate_runs
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
from ._registry import Registry
from ._routing import RoutingEngine
from ._runner import Abandoned, Completed, Failed, Outcome, StageRequest, StageRunner, Suspended
from ._secrets import SecretUrl, redact_url
from ._settings import EngineSettings
from .errors import EngineError, NonRetryableError

__all__ = [
    "DEFAULT_SPILL_THRESHOLD",
    "Abandoned",
    "BlobStore",
    "ClaimCheck",
    "Clock",
    "Completed",
    "EngineError",
    "EngineMetrics",
    "EngineSettings",
    "ErrorInfo",
    "Event",
    "EventDraft",
    "EventSink",
    "Failed",
    "FakeClock",
    "FlushResult",
    "FolderBlobStore",
    "GraphModel",
    "InMemoryLedger",
    "JsonlFileSink",
    "Lifecycle",
    "MemoryBlobStore",
    "MemorySink",
    "MigrationReport",
    "NonRetryableError",
    "Outcome",
    "Registry",
    "Retry",
    "RoutingEngine",
    "RunInfo",
    "RunMove",
    "RunSnapshot",
    "RunStatus",
    "SecretUrl",
    "SignalResult",
    "Stage",
    "StageContext",
    "StageInfo",
    "StageRequest",
    "StageRunner",
    "StageSpec",
    "StageStatus",
    "StepLedger",
    "StepRecord",
    "Steps",
    "Suspended",
    "SyncSteps",
    "SystemClock",
    "VersionInfo",
    "Workflow",
    "WorkflowEngine",
    "attach_metrics",
    "box_inline",
    "copy_blobs",
    "create_engine",
    "event_id",
    "is_spill_ref",
    "migrate_run",
    "migrate_runs",
    "open_blob_store",
    "open_event_sink",
    "redact_url",
    "run_output",
    "run_prefix",
    "serve_metrics",
]
