"""The visibility query of a run listing: one builder for ``list_runs`` and ``list_runs_page``
(``_paging``), so both filter the same way."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from temporalio.client import WorkflowExecution

from engine_port import RunStatus

from ._helpers import _ACTIVE, _ALL, _quote
from ._search import SA_IDEMPOTENCY_KEY, SA_VERSION

__all__ = [
    "CONTINUED_LAG_S",
    "matches_filters",
    "recent_continues",
    "runs_query",
    "status_clause",
    "wanted_statuses",
]

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


# what a user's string may hold to be put in a visibility query as it is: no quote, backslash
# or control character. The dev server's SQLite visibility store decodes a string literal's
# escapes and re-escapes it MySQL's way, which SQLite reads literally: a backslash in a value
# matched nothing, a quote at the end of a STARTS_WITH prefix was dropped (the prefix "'"
# listed every run). Anything else is filtered here instead (``matches_filters``).
_UNQUOTABLE = re.compile(r"[\\'\"\x00-\x1f\x7f]")


def _plain_head(value: str) -> str:
    """The longest leading part of ``value`` a visibility query can carry as it is."""
    bad = _UNQUOTABLE.search(value)
    return value if bad is None else value[: bad.start()]


def matches_filters(
    ex: WorkflowExecution,
    *,
    id_prefix: str | None = None,
    version: str | None = None,
    idempotency_key: str | None = None,
) -> bool:
    """Whether an execution a listing's visibility query found matches its filters exactly:
    visibility may compare more loosely (the dev server's STARTS_WITH ignores case) or not
    at all (a value ``runs_query`` could not put in the query)."""
    if id_prefix and not ex.id.startswith(id_prefix):
        return False
    attrs = ex.typed_search_attributes
    if version is not None and attrs.get(SA_VERSION) != version:
        return False
    return idempotency_key is None or attrs.get(SA_IDEMPOTENCY_KEY) == idempotency_key


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
    every filter given (``continued_after``: see ``status_clause``). A value it cannot carry
    (``_UNQUOTABLE``) is left out, or cut to its leading part: the listing checks every
    execution it finds with ``matches_filters``."""
    clauses = [scope, status_clause(wanted_statuses(status), continued_after)]
    if workflow_id is not None:  # (letters, digits, '_' and '-': ``Workflow``)
        clauses.append(f"WorkflowType = '{_quote(workflow_id)}'")
    if version is not None and _plain_head(version) == version:
        clauses.append(f"WfeVersion = '{_quote(version)}'")
    if created_after is not None:
        at = created_after.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        clauses.append(f"StartTime >= '{at}'")
    if id_prefix and _plain_head(id_prefix):
        clauses.append(f"WorkflowId STARTS_WITH '{_quote(_plain_head(id_prefix))}'")
    if idempotency_key is not None and _plain_head(idempotency_key) == idempotency_key:
        clauses.append(f"WfeIdempotencyKey = '{_quote(idempotency_key)}'")
    return " AND ".join(clauses)
