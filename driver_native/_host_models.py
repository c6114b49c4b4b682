"""The serverless host's message and result models (the seed's shapes, in Python naming).

Every model is snake_case in Python and carries the seed's camelCase name as its alias:
``model_dump(by_alias=True)`` (or ``model_dump_json(by_alias=True)``) gives the seed's keys,
and ``model_validate`` accepts either spelling, so a queue message written by a producer that
follows the seed parses as is.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from engine_port.errors import EngineError

__all__ = [
    "HandleJobResult",
    "JobMessage",
    "JobMessageError",
    "MaintenanceTickResult",
    "ProcessJobsResult",
    "RunToCompletionResult",
]


class _SeedModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class JobMessageError(EngineError):
    """A queue message that is not a job message (``handle_job`` reports it ``dead``)."""

    def __init__(self, message: Any, problem: str, *, mismatch: bool = False) -> None:
        self.message = message
        self.mismatch = mismatch  # well-formed, but names another job than the row
        super().__init__(
            f"not a job message ({problem}): {message!r:.300}. Send what job_message() "
            "builds: {'jobId': N, 'workflowRunId': ..., 'workflowId': ..., 'stageId': ..., "
            "'attempt': N, 'payload': {...}}"
        )


class JobMessage(_SeedModel):
    """One job as a queue message. Only ``job_id`` is required: the database is the queue,
    so the rest is read from the job's row; when given, it must match that row (a stale or
    foreign message is acknowledged as ``dead`` instead of running another job)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )

    job_id: int = Field(ge=1)  # jobId
    workflow_run_id: str | None = None  # workflowRunId
    workflow_id: str | None = None  # workflowId
    stage_id: str | None = None  # stageId
    attempt: int | None = Field(default=None, ge=1)  # attempt
    # payload: the seed carries the run's config here; the native driver keeps it in the
    # database, so a payload is accepted and ignored (never spilled: nothing to unpack)
    payload: dict[str, Any] | None = None

    @field_validator("job_id", "attempt", mode="before")
    @classmethod
    def _not_a_flag(cls, value: Any) -> Any:
        # a queue's string id ("12") is a number; `true` is not job 1
        if isinstance(value, bool):
            raise ValueError("a number, not true/false")
        return value


HandleOutcome = Literal["completed", "suspended", "failed"]


class HandleJobResult(_SeedModel):
    """What ``handle_job`` did with one message (seed: ``{outcome, error?, dead?, willRetry?,
    attempt?, maxAttempts?, retryDelayMs?}``), with the native driver's detail beside it.

    A queue consumer acts on it exactly as the seed's example does: ``ack`` when ``outcome``
    is ``completed`` or ``suspended``; ``retry`` after ``retry_delay_ms`` when ``will_retry``
    and not ``dead``; otherwise ``ack`` (failed for good, or ``dead``: already failed and
    acknowledged, never retry).
    """

    outcome: HandleOutcome
    error: str | None = None
    dead: bool = False  # dead: orphan, malformed, gone, not served, lease lost, run cancelled,
    # run being moved to another driver (frozen)
    will_retry: bool = False  # willRetry
    attempt: int | None = None
    max_attempts: int | None = None  # maxAttempts
    retry_delay_ms: int | None = None  # retryDelayMs: until the job is due again
    # native extras
    detail: str = Field(
        description="the kernel's outcome: completed, suspended, retrying, failed, cancelled, "
        "compensated, deferred, skipped, discarded, abandoned, busy, not_due, gone, "
        "not_served, malformed, mismatch, frozen"
    )
    job_id: int | None = None  # jobId
    workflow_run_id: str | None = None  # workflowRunId
    stage_id: str | None = None  # stageId
    kind: str | None = None  # "stage" or "compensate"
    ready_job_ids: list[int] = Field(default_factory=list)  # readyJobIds: due now, enqueue them

    @property
    def ack(self) -> bool:
        """The seed's decision: acknowledge the message (else re-deliver it after
        ``retry_delay_ms``)."""
        return not (self.outcome == "failed" and self.will_retry and not self.dead)


class ProcessJobsResult(_SeedModel):
    """``process_available_jobs``: seed ``{processed, succeeded, failed}`` plus each result."""

    processed: int = 0
    succeeded: int = 0  # completed or suspended
    failed: int = 0
    results: list[HandleJobResult] = Field(default_factory=list)


class MaintenanceTickResult(_SeedModel):
    """``run_maintenance_tick`` (seed keys beside each field)."""

    claimed: int = 0  # claimed: always 0, run.create enqueues the first stages itself
    suspended_checked: int = 0  # suspendedChecked: suspended stages made due again
    stale_released: int = 0  # staleReleased: leases of dead workers released
    events_flushed: int = 0  # eventsFlushed: published to the sink
    stuck_reaped: int = 0  # stuckReaped: stuck runs repaired
    purged: int = 0  # purged: finished runs deleted (only with ``retention``)
    events_failed: int = 0  # eventsFailed: refused by the sink, retried later
    events_dead_lettered: int = 0  # eventsDeadLettered: disjoint from events_failed
    event_sink_status: Literal["healthy", "degraded"] = "healthy"  # eventSinkStatus
    event_sink_error: str | None = None  # eventSinkError


RunOutcome = Literal["completed", "failed", "cancelled", "suspended", "incomplete"]


class RunToCompletionResult(_SeedModel):
    """``run_to_completion`` (seed: ``{workflowRunId, status, outcome, output?, reason?,
    jobsProcessed, foreignJobsProcessed, suspendedStageId?}``)."""

    workflow_run_id: str  # workflowRunId
    status: str  # the run's status
    outcome: RunOutcome
    output: Any = None
    reason: str | None = None  # why incomplete / failed
    jobs_processed: int = 0  # jobsProcessed: this run's and foreign jobs
    foreign_jobs_processed: int = 0  # foreignJobsProcessed
    suspended_stage_id: str | None = None  # suspendedStageId
    created: bool = False  # native extra: this call created the run (not an idempotent repeat)
