"""Typed commands of the native kernel. Each is one transaction (job.execute runs user code
between two)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "SKIPPED",
    "CancelRun",
    "ClaimPending",
    "Command",
    "CreateRun",
    "ExecuteJob",
    "FlushOutbox",
    "Heartbeat",
    "ListVersions",
    "PollSuspended",
    "PurgeRuns",
    "ReapStaleLeases",
    "ReapStuckRuns",
    "RedriveRun",
    "ReleaseJobs",
    "ReplayDlq",
    "SignalStep",
    "Transition",
]


@dataclass(frozen=True)
class Command:
    name: ClassVar[str] = "command"


@dataclass(frozen=True)
class CreateRun(Command):
    name: ClassVar[str] = "run.create"
    workflow_id: str
    input: Any
    idempotency_key: str | None = None
    version: str | None = None
    run_id: str | None = None
    trace_context: str | None = None  # the W3C traceparent of the run's wfe.run span
    # a local worker to hand the first stages to in the creating transaction (leased to it and
    # marked running there; the host runs them without a trip through the queue)
    handoff: Any = field(default=None, compare=False, repr=False)
    # ``input`` is already the validated input as stored (``check_start_input``'s value):
    # not validated again
    validated: bool = field(default=False, compare=False, repr=False)


@dataclass(frozen=True)
class ClaimPending(Command):
    """Lease due jobs (new stages, retries, woken suspensions) this host serves."""

    name: ClassVar[str] = "run.claim_pending"
    worker_id: str
    limit: int = 1
    served: frozenset[str] | None = None  # "workflow@version"; None = the registry's
    # begin the claimed stage attempts in the claiming transaction: the result is then a list
    # of ``(job, begun)`` (``begun``: the ``Begin`` to pass to ``ExecuteJob``; None for a
    # compensation job; ``SKIPPED`` for a stage that is not to run, e.g. of a cancelled run)
    begin: bool = False
    # look (an autocommit read) before taking a write transaction; False when the host was
    # just told that work is due (PostgreSQL only: on SQLite the look spares the write lock)
    probe: bool = True
    # told after the look, in the same read: the earliest time a job it would claim is due
    # (the kernel's clock, epoch seconds; None: there is none) and whether that is now (the
    # claim follows). A time to come: the host sets its timer for it, so that what a stopped
    # worker or another process left sleeping resumes on time, not at the next poll
    on_next_due: Callable[[float | None, bool], None] | None = field(default=None, compare=False)


SKIPPED = "skipped"
"""``ClaimPending(begin=True)``: a claimed stage that was not begun (its run is stopping, or
the stage is no longer to run); the claim already settled it, nothing is to execute."""


@dataclass(frozen=True)
class ExecuteJob(Command):
    name: ClassVar[str] = "job.execute"
    job: Any
    worker_id: str
    stop: asyncio.Event | None = field(default=None, compare=False)
    # up to ``handoff`` jobs the outcome enqueues are leased to this worker at once and
    # passed to ``on_handoff`` (the host runs them without a trip through the queue)
    handoff: int = 0
    on_handoff: Callable[[list[tuple[Any, Any]]], None] | None = field(default=None, compare=False)
    begun: Any = field(default=None, compare=False)  # a handed-off stage already running
    # told, once the outcome is committed, when the job is due again if that is in the future
    # (the kernel's clock, epoch seconds: a sleep's or a wait's deadline, a retry's delay):
    # the host sets a timer for it instead of finding it at its next poll
    on_due: Callable[[float], None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Heartbeat(Command):
    name: ClassVar[str] = "job.heartbeat"
    job_id: int
    worker_id: str
    # the claim being renewed (the job row's ``lease_token`` as the claim returned it): a
    # later claim of the job, by this very worker too, is not renewed by this heartbeat;
    # None: any claim of ``worker_id``
    lease_token: int | None = None


@dataclass(frozen=True)
class Transition(Command):
    """Record a stage attempt's outcome (normally done inside job.execute)."""

    name: ClassVar[str] = "run.transition"
    job: Any
    worker_id: str
    outcome: Any
    cancelled: bool = False


@dataclass(frozen=True)
class CancelRun(Command):
    name: ClassVar[str] = "run.cancel"
    run_id: str


@dataclass(frozen=True)
class RedriveRun(Command):
    name: ClassVar[str] = "run.redrive"
    run_id: str
    from_: str = "last_failure"
    version: str | None = None


@dataclass(frozen=True)
class PollSuspended(Command):
    name: ClassVar[str] = "stage.poll_suspended"


@dataclass(frozen=True)
class SignalStep(Command):
    name: ClassVar[str] = "step.signal"
    run_id: str
    signal: str
    payload: Any = None
    idempotency_key: str | None = None  # a repeat in the same run is not queued again
    # a local worker (``_progress.Handoff``) to hand the stage this signal wakes to, leased
    # and begun in the signal's transaction, if its "workflow@version" is in ``served``
    handoff: Any = field(default=None, compare=False, repr=False)
    served: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class ReapStaleLeases(Command):
    name: ClassVar[str] = "lease.reap_stale"


@dataclass(frozen=True)
class FlushOutbox(Command):
    name: ClassVar[str] = "outbox.flush"
    limit: int = 500
    force: bool = False  # also try events whose retry is not due yet (flush_events())


@dataclass(frozen=True)
class ReplayDlq(Command):
    name: ClassVar[str] = "dlq.replay"


@dataclass(frozen=True)
class ReapStuckRuns(Command):
    name: ClassVar[str] = "run.reap_stuck"
    grace_seconds: float = 60.0


@dataclass(frozen=True)
class PurgeRuns(Command):
    name: ClassVar[str] = "run.purge"
    older_than_seconds: float = 7 * 24 * 3600


@dataclass(frozen=True)
class ListVersions(Command):
    name: ClassVar[str] = "run.list_versions"


@dataclass(frozen=True)
class ReleaseJobs(Command):
    name: ClassVar[str] = "job.release"
    job_ids: tuple[int, ...]
    worker_id: str
    # the claim of each job given back (``lease_token``s, in ``job_ids`` order): a job
    # claimed again since, by this very worker too, is not; None: any claim of ``worker_id``
    lease_tokens: tuple[int, ...] | None = None
