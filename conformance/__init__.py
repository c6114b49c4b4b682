"""The conformance suite: the contract every workflow-engine driver must pass.

A driver opts in with one pytest class that inherits :class:`AllContracts` and provides a
``harness`` fixture returning a :class:`Harness` (an engine factory plus its
:class:`Capabilities`). See conformance/README.md.
"""

from ._admin import BadInputContract, IdempotencyContract, VersionContract
from ._blindspots import BlindSpotContract
from ._crash import CrashContract
from ._flow import ClaimCheckContract, FlowContract, HookContract, RetryContract, SleepContract
from ._harness import (
    Capabilities,
    ExecutionLog,
    Harness,
    SettingsHarness,
    eventually,
    unique_id,
    wait_for_events,
)
from ._hooks import HookEdgeContract
from ._hostile import HostileDataContract
from ._listing import ListingContract
from ._migrate import MigrationContract
from ._parallel import ParallelFailureContract
from ._parallel_signals import ParallelSignalContract
from ._saga import CancelContract, CompensationContract, RedriveContract
from ._signals import SignalContract, TimeoutContract
from ._sink import EventSinkContract
from ._trace import check_golden, normalise, run_summary

__all__ = [
    "AllContracts",
    "BadInputContract",
    "BlindSpotContract",
    "CancelContract",
    "Capabilities",
    "ClaimCheckContract",
    "CompensationContract",
    "CrashContract",
    "EventSinkContract",
    "ExecutionLog",
    "FlowContract",
    "Harness",
    "HookContract",
    "HookEdgeContract",
    "HostileDataContract",
    "IdempotencyContract",
    "ListingContract",
    "MigrationContract",
    "ParallelFailureContract",
    "ParallelSignalContract",
    "RedriveContract",
    "RetryContract",
    "SettingsHarness",
    "SignalContract",
    "SleepContract",
    "TimeoutContract",
    "VersionContract",
    "check_golden",
    "eventually",
    "normalise",
    "run_summary",
    "unique_id",
    "wait_for_events",
]


class AllContracts(
    FlowContract,
    RetryContract,
    SleepContract,
    HookContract,
    HookEdgeContract,
    ClaimCheckContract,
    CompensationContract,
    CancelContract,
    ParallelFailureContract,
    ParallelSignalContract,
    RedriveContract,
    SignalContract,
    TimeoutContract,
    IdempotencyContract,
    VersionContract,
    BadInputContract,
    CrashContract,
    BlindSpotContract,
    HostileDataContract,
    EventSinkContract,
    ListingContract,
):
    """Every scenario of the contract."""
