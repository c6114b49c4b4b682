"""The visibility query of a run listing: one builder for ``list_runs`` and ``list_runs_page``
(``_paging``), so both filter the same way."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from engine_port import RunStatus

from ._helpers import _ACTIVE, _ALL, _quote

__all__ = ["CONTINUED_LAG_S", "recent_continues", "runs_query", "status_clause", "wanted_statuses"]

CONTINUED_LAG_S = 60.0
"""How long after it continued as new (``GraphWorkflow._continue``) an execution is still listed
for its run under an active status. Visibility records the old execution's close apart from the
new one's start: for a moment it lists the old one closed and not yet the new one (the run was
listed under no status at all), or both running (``_paging.superseded`` keeps the newest)."""


def wanted_statuses(status: RunStatus | Sequence[RunStatus] | None) -> Sequence[str]:
    """The statuses a listing asks for (all of them when None)."""
    if status is None:
        return _ALL
    if isinstance(status, str):
        return [str(status)]
    return [str(s) for s in status]


def _in(values: Sequence[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def recent_continues(now: datetime | None = None) -> str:
    """The ``continued_after`` of a listing made now: ``CONTINUED_LAG_S`` ago."""
    at = (now or datetime.now(UTC)) - timedelta(seconds=CONTINUED_LAG_S)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def status_clause(wanted: Sequence[str], continued_after: str | None = None) -> str:
    """The visibility filter for runs of the ``wanted`` statuses. A run whose execution was
    terminated (or timed out) outside the engine still has the active WfeStatus it last
    wrote: it is listed as ``failed`` (see ``TemporalEngine._ended_outside``), never as
    active. ``continued_after`` (``recent_continues``): an active run's execution that
    continued as new since then is listed too, for the moment its new execution is not
    (``CONTINUED_LAG_S``; ``_paging.superseded`` drops it once it is)."""
    ended = "ExecutionStatus IN ('Terminated', 'TimedOut')"
    running = "ExecutionStatus = 'Running'"
    if continued_after is not None:
        recent = f"ExecutionStatus = 'ContinuedAsNew' AND CloseTime > '{continued_after}'"
        running = f"({running} OR ({recent}))"
    done = [s for s in wanted if s not in _ACTIVE]
    active = [s for s in wanted if s in _ACTIVE]
    parts = []
    if done:
        parts.append(f"WfeStatus IN {_in(done)}")
    if active:
        parts.append(f"(WfeStatus IN {_in(active)} AND {running})")
    if "failed" in wanted:
        parts.append(f"(WfeStatus IN {_in(_ACTIVE)} AND {ended})")
    return "(" + " OR ".join(parts) + ")"


def runs_query(
    scope: str,
    status: RunStatus | Sequence[RunStatus] | None,
    *,
    workflow_id: str | None = None,
    id_prefix: str | None = None,
    version: str | None = None,
    created_after: datetime | None = None,
    idempotency_key: str | None = None,
    continued_after: str | None = None,
) -> str:
    """The visibility query for the runs in ``scope`` (the engine's task queues) that match
    every filter given (``continued_after``: see ``status_clause``)."""
    clauses = [scope, status_clause(wanted_statuses(status), continued_after)]
    if workflow_id is not None:
        clauses.append(f"WorkflowType = '{_quote(workflow_id)}'")
    if version is not None:
        clauses.append(f"WfeVersion = '{_quote(version)}'")
    if created_after is not None:
        at = created_after.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        clauses.append(f"StartTime >= '{at}'")
    if id_prefix:
        clauses.append(f"WorkflowId STARTS_WITH '{_quote(id_prefix)}'")
    if idempotency_key is not None:
        clauses.append(f"WfeIdempotencyKey = '{_quote(idempotency_key)}'")
    return " AND ".join(clauses)
