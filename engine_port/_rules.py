"""The rules every driver applies, written once: drivers call these, never copy them.

tests/unit/test_shared_rules.py fails when a driver writes one of them out again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._graph import GraphModel, Workflow
from ._limits import check_start_call
from ._models import RunStatus
from .errors import InvalidRedriveError

if TYPE_CHECKING:
    from ._registry import Registry

__all__ = [
    "REDRIVABLE_RUN_STATUSES",
    "WORKING_RUN_STATUSES",
    "redrive_plan",
    "repin_plan",
    "sink_retry_delay",
    "start_definition",
    "version_key",
]

# a run whose stages may still be begun (not compensating, not terminal)
WORKING_RUN_STATUSES = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.SUSPENDED})
# a run redrive() re-runs (terminal, and not moved to another driver)
REDRIVABLE_RUN_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})

# far below what a timedelta or a float sleep can hold
_MAX_DELAY_S = 365 * 24 * 3600.0  # as Retry delays


def version_key(workflow_id: str, version: str) -> str:
    """The ``workflow@version`` key a served version and a run's version are matched by."""
    return f"{workflow_id}@{version}"


def start_definition(
    registry: Registry,
    workflow: str | Workflow[Any],
    idempotency_key: str | None,
    version: str | None,
) -> Workflow[Any]:
    """The definition ``engine.start(workflow, ..., idempotency_key=, version=)`` runs, after
    the call's argument checks (:func:`check_start_call`): a Workflow object runs its own
    version, a workflow id the registry's latest, and ``version`` wins over both. Raises
    WorkflowNotFoundError when the registry does not hold that (workflow, version)."""
    wf_id = workflow.id if isinstance(workflow, Workflow) else workflow
    check_start_call(wf_id, idempotency_key, version)
    if isinstance(workflow, Workflow) and version is None:
        version = workflow.version
    return registry.get(wf_id, version)


def sink_retry_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Seconds before delivering an event again after ``failures`` failed deliveries in a
    row: ``initial_s`` doubling per failure, capped at ``max_s`` (never overflows)."""
    try:
        seconds = initial_s * 2.0 ** max(0, failures - 1)
    except OverflowError:
        seconds = math.inf
    return float(min(seconds, max_s, _MAX_DELAY_S))


def redrive_plan(
    graph: GraphModel, from_: str, statuses: Mapping[str, str], run_id: str
) -> set[str]:
    """The stages a redrive from ``from_`` re-runs on ``graph`` (the version the run is
    redriven on), given the status of each stage the run has. InvalidRedriveError when the
    run's stages are not ``graph``'s (a redrive onto a version with other stages) or
    ``from_`` names nothing to redrive; nothing may be changed before this returns."""
    ids = {s.id for s in graph.stages}
    if set(statuses) != ids:
        raise InvalidRedriveError(
            f"run {run_id!r} cannot move to version {graph.version!r}: its stages differ "
            f"({sorted(statuses)} vs {sorted(ids)}); redrive it on its own version"
        )
    return graph.redrive_set(from_, statuses, run_id)


def repin_plan(run_graph: GraphModel, graph: GraphModel, from_: str, run_id: str) -> bool:
    """Whether a redrive of a run that has not ended (pending or suspended, no stage attempt
    running: the driver checks that) re-pins it from ``run_graph`` (its version now) to
    ``graph`` (the version asked for); False: it is on that version already, nothing to do.
    A re-pin re-runs nothing: completed stages, journals, waits and queued signals stay,
    and the next attempt (or resume) runs ``graph``'s bodies. InvalidRedriveError when
    ``from_`` is not the default (it names what a terminal run re-runs) or when ``graph``'s
    stages or their dependencies are not the run's; nothing may be changed before this
    returns."""
    if from_ != "last_failure":
        raise InvalidRedriveError(
            f"cannot redrive run {run_id!r} from {from_!r}: it has not ended, and from_ "
            "applies to a terminal run (it names what is run again); to re-pin a pending or "
            "suspended run to another version call redrive(run_id, version=...) without "
            "from_, or wait for it to end"
        )
    mine = {s.id: sorted(s.after) for s in run_graph.stages}
    theirs = {s.id: sorted(s.after) for s in graph.stages}
    if mine != theirs:
        raise InvalidRedriveError(
            f"run {run_id!r} cannot move to version {graph.version!r}: its stages differ "
            f"({mine} vs {theirs}); a run that has not ended moves only to a version with "
            "the same stages and dependencies: let it finish on its own version (start a "
            "worker that serves it) or cancel it"
        )
    return graph.version != run_graph.version
