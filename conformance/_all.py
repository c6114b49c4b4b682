"""Every scenario of the contract in one class (:class:`conformance.AllContracts`)."""

from __future__ import annotations

from ._admin import BadInputContract, IdempotencyContract, VersionContract
from ._blindspots import BlindSpotContract
from ._corners import CornerContract
from ._crash import CrashContract
from ._flow import ClaimCheckContract, FlowContract, HookContract, RetryContract, SleepContract
from ._hooks import HookEdgeContract
from ._hostile import HostileDataContract
from ._listing import ListingContract
from ._misbehaving import MisbehavingBodyContract
from ._parallel import ParallelFailureContract
from ._parallel_signals import ParallelSignalContract
from ._saga import CancelContract, CompensationContract, RedriveContract
from ._signals import SignalContract, SignalGateContract, TimeoutContract
from ._sink import EventSinkContract
from ._timing import TimingContract
from ._views import RunViewContract

__all__ = ["AllContracts"]


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
    CornerContract,
    SignalContract,
    SignalGateContract,
    TimeoutContract,
    IdempotencyContract,
    VersionContract,
    BadInputContract,
    CrashContract,
    BlindSpotContract,
    HostileDataContract,
    EventSinkContract,
    ListingContract,
    MisbehavingBodyContract,
    TimingContract,
    RunViewContract,
):
    """Every scenario of the contract."""
