"""The native driver: a stateless command kernel over SQLite or PostgreSQL and a blob store."""

from ._commands import (
    CancelRun,
    ClaimPending,
    Command,
    CreateRun,
    ExecuteJob,
    FlushOutbox,
    Heartbeat,
    ListVersions,
    PollSuspended,
    PurgeRuns,
    ReapStaleLeases,
    ReapStuckRuns,
    RedriveRun,
    ReleaseJobs,
    ReplayDlq,
    SignalStep,
    Transition,
)
from ._db import Database
from ._engine import NativeEngine, create_native_engine
from ._kernel import Kernel
from ._serverless import (
    handle_job,
    process_available_jobs,
    run_maintenance_tick,
    run_to_completion,
)
from ._worker import WorkerHost

__all__ = [
    "CancelRun",
    "ClaimPending",
    "Command",
    "CreateRun",
    "Database",
    "ExecuteJob",
    "FlushOutbox",
    "Heartbeat",
    "Kernel",
    "ListVersions",
    "NativeEngine",
    "PollSuspended",
    "PurgeRuns",
    "ReapStaleLeases",
    "ReapStuckRuns",
    "RedriveRun",
    "ReleaseJobs",
    "ReplayDlq",
    "SignalStep",
    "Transition",
    "WorkerHost",
    "create_native_engine",
    "handle_job",
    "process_available_jobs",
    "run_maintenance_tick",
    "run_to_completion",
]
