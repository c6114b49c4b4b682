"""The conformance suite: the contract every workflow-engine driver must pass.

A driver opts in with one pytest class that inherits :class:`AllContracts` and provides a
``harness`` fixture returning a :class:`Harness` (an engine factory plus its
:class:`Capabilities`). See conformance/README.md.

The names are imported when first used (``from conformance import AllContracts``), not with
the package: a pytest session marks the scenario modules for assertion rewriting before that
(:mod:`conformance.plugin`), so a failing ``assert`` explains itself (``assert 'failed' ==
'completed'``), also in ``wfe conformance``, which imports :mod:`conformance._cli` before it
starts pytest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._admin import BadInputContract, IdempotencyContract, VersionContract
    from ._all import AllContracts
    from ._blindspots import BlindSpotContract
    from ._corners import CornerContract
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
    from ._misbehaving import MisbehavingBodyContract
    from ._parallel import ParallelFailureContract
    from ._parallel_signals import ParallelSignalContract
    from ._saga import CancelContract, CompensationContract, RedriveContract
    from ._signals import SignalContract, SignalGateContract, TimeoutContract
    from ._sink import EventSinkContract
    from ._timing import TimingContract
    from ._trace import check_golden, normalise, run_summary
    from ._views import RunViewContract

__all__ = [
    "AllContracts",
    "BadInputContract",
    "BlindSpotContract",
    "CancelContract",
    "Capabilities",
    "ClaimCheckContract",
    "CompensationContract",
    "CornerContract",
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
    "MisbehavingBodyContract",
    "ParallelFailureContract",
    "ParallelSignalContract",
    "RedriveContract",
    "RetryContract",
    "RunViewContract",
    "SettingsHarness",
    "SignalContract",
    "SignalGateContract",
    "SleepContract",
    "TimeoutContract",
    "TimingContract",
    "VersionContract",
    "check_golden",
    "eventually",
    "normalise",
    "run_summary",
    "unique_id",
    "wait_for_events",
]

_MODULES = {
    "AllContracts": "_all",
    "BadInputContract": "_admin",
    "BlindSpotContract": "_blindspots",
    "CancelContract": "_saga",
    "Capabilities": "_harness",
    "ClaimCheckContract": "_flow",
    "CompensationContract": "_saga",
    "CornerContract": "_corners",
    "CrashContract": "_crash",
    "EventSinkContract": "_sink",
    "ExecutionLog": "_harness",
    "FlowContract": "_flow",
    "Harness": "_harness",
    "HookContract": "_flow",
    "HookEdgeContract": "_hooks",
    "HostileDataContract": "_hostile",
    "IdempotencyContract": "_admin",
    "ListingContract": "_listing",
    "MigrationContract": "_migrate",
    "MisbehavingBodyContract": "_misbehaving",
    "ParallelFailureContract": "_parallel",
    "ParallelSignalContract": "_parallel_signals",
    "RedriveContract": "_saga",
    "RetryContract": "_flow",
    "RunViewContract": "_views",
    "SettingsHarness": "_harness",
    "SignalContract": "_signals",
    "SignalGateContract": "_signals",
    "SleepContract": "_flow",
    "TimeoutContract": "_signals",
    "TimingContract": "_timing",
    "VersionContract": "_admin",
    "check_golden": "_trace",
    "eventually": "_harness",
    "normalise": "_trace",
    "run_summary": "_trace",
    "unique_id": "_harness",
    "wait_for_events": "_harness",
}


def __getattr__(name: str) -> Any:
    """Import a name's module when the name is first used (see the module docstring)."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
