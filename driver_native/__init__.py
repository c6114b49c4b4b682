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
]
