"""Port models: identical for every driver. No driver type ever crosses the port."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ACTIVE_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "ErrorInfo",
    "Event",
    "FlushResult",
    "RunInfo",
    "RunSnapshot",
    "RunStatus",
    "SignalResult",
    "SnapshotSignal",
    "SnapshotStage",
    "SnapshotStep",
    "SnapshotWait",
    "StageInfo",
    "StageStatus",
    "VersionInfo",
]


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    MIGRATED = "migrated"


TERMINAL_RUN_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.MIGRATED}
)
ACTIVE_RUN_STATUSES = frozenset(set(RunStatus) - TERMINAL_RUN_STATUSES)


class StageStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COMPENSATED = "compensated"
    SKIPPED = "skipped"


_SURROGATE = re.compile("[\ud800-\udfff]")


class ErrorInfo(BaseModel):
    """A recorded error: exception type name, message and the stage it came from.

    ``traceback`` is the formatted traceback of an exception raised by user code (a stage
    body or a compensation), from the user's function down to the ``raise``, bounded in size
    (the innermost frames are kept); None for errors the engine raised itself."""

    model_config = ConfigDict(frozen=True)
    type: str
    message: str
    stage: str | None = None
    traceback: str | None = None

    @field_validator("type", "message", "traceback")
    @classmethod
    def _storable(cls, text: str | None) -> str | None:
        """A lone UTF-16 surrogate (``ValueError("bad \\ud800")``, text decoded with
        ``surrogateescape``) is written as its escape ``\\ud800``: no backend stores it as
        UTF-8 (Temporal could not encode the failed attempt, so the run never ended; a
        native RunInfo could not be dumped as JSON)."""
        if text is not None and _SURROGATE.search(text) is not None:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
        return text

    @classmethod
    def of(cls, exc: BaseException, stage: str | None = None) -> ErrorInfo:
        return cls(type=type(exc).__name__, message=str(exc), stage=stage)


class Event(BaseModel):
    """A lifecycle or business event with a stable id and a per-run sequence number."""

    model_config = ConfigDict(frozen=True)
    id: str
    run_id: str
    seq: int
    type: str
    workflow_id: str
    stage: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    business: bool = False
    at: datetime


class StageInfo(BaseModel):
    id: str
    status: StageStatus
    attempt: int = 0
    output: Any = None
    error: ErrorInfo | None = None
    compensation_error: ErrorInfo | None = None
    waiting_for: str | None = None
    wake_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class RunInfo(BaseModel):
    """A run as a driver reads it.

    ``frozen``: the run is being moved to another driver (``migrate_run`` exported it and
    has not finished the move yet): it runs no stage and its signals and cancels are refused
    until the move completes (then its status here is ``migrated``) or is aborted. A run that
    stays frozen had its migration interrupted: ``wfe migrate --from SOURCE --to TARGET --run
    ID`` finishes the move, the same with ``--abort`` gives the run back (``migrate_run()``,
    ``abort_migration()`` in code). Always False for a run that ended."""

    id: str
    workflow_id: str
    version: str
    status: RunStatus
    input: Any = None
    output: Any = None
    error: ErrorInfo | None = None
    compensation_errors: list[ErrorInfo] = Field(default_factory=list)
    stages: list[StageInfo] = Field(default_factory=list)
    idempotency_key: str | None = None
    migrated_to: str | None = None
    redrive_count: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    frozen: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    def stage(self, stage_id: str) -> StageInfo:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)


class SignalResult(BaseModel):
    """What ``engine.signal`` did with a signal.

    ``delivered``: the signal went to a step waiting for it at that moment (nothing of that
    name was queued ahead of it); False when it was buffered for a later wait (signals of one
    name queue in arrival order, nothing is dropped). ``already_completed``: the signal's
    idempotency key was seen before in this run, so it was not queued again."""

    run_id: str
    name: str
    delivered: bool
    already_completed: bool = False


class VersionInfo(BaseModel):
    """One version of a workflow: its active runs, whether this engine's workers serve it,
    ``drained`` when no run of it is active any more (as Temporal says of a Worker Deployment
    version), ``latest`` when it is the registry's newest, and ``new_runs_to``: the target
    that ``drain()`` named when this engine stopped taking new runs of the workflow (None:
    new runs start here)."""

    workflow_id: str
    version: str
    active_runs: int
    served_here: bool
    drained: bool
    latest: bool = False
    new_runs_to: str | None = None


class FlushResult(BaseModel):
    """What one outbox flush did, the same on every driver (the seed's ``outbox.flush``
    result: ``published, failed, deadLettered, eventSinkStatus, eventSinkError``).

    ``failed`` and ``dead_lettered`` are disjoint: ``failed`` counts events the sink refused
    that are retried by a later flush; ``dead_lettered`` those that exhausted their retry
    budget in this flush (they wait for ``replay_dlq()``). ``sink_status`` is ``degraded`` when
    the sink refused at least one event (or events wait for a retry), with its first error in
    ``sink_error``."""

    published: int = 0
    failed: int = 0
    dead_lettered: int = 0
    sink_status: Literal["healthy", "degraded"] = "healthy"
    sink_error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        # the names before issue 16 (delivered, dead, degraded), still accepted
        if isinstance(data, dict) and {"delivered", "dead", "degraded"} & data.keys():
            data = dict(data)
            if "delivered" in data:
                data.setdefault("published", data.pop("delivered"))
            if "dead" in data:
                data.setdefault("dead_lettered", data.pop("dead"))
            if "degraded" in data:
                data.setdefault("sink_status", "degraded" if data.pop("degraded") else "healthy")
        return data

    @property
    def delivered(self) -> int:
        """``published`` (the name before issue 16)."""
        return self.published

    @property
    def dead(self) -> int:
        """``dead_lettered`` (the name before issue 16)."""
        return self.dead_lettered

    @property
    def degraded(self) -> bool:
        """``sink_status == "degraded"``."""
        return self.sink_status == "degraded"


class SnapshotStep(BaseModel):
    """One journaled durable step of a stage."""

    name: str
    kind: str = Field(description="run | sleep | signal | poll")
    completed: bool
    result: Any = Field(default=None, description="JSON, or a spill reference into the blob store")
    deadline: datetime | None = Field(
        default=None, description="a sleep's wake time or a wait's timeout, fixed at first run"
    )
    signal: str | None = None
    meta: dict[str, Any] | None = Field(
        default=None,
        description="the engine's note about the step (a wait's timeout, the business events "
        "its function staged); None: journaled before such notes",
    )


class SnapshotSignal(BaseModel):
    """One buffered signal, not yet consumed by a wait."""

    name: str
    payload: Any = Field(default=None, description="JSON, or a spill reference")
    idempotency_key: str | None = None


class SnapshotWait(BaseModel):
    """A wait a stage's attempt suspended in: what names its ``stage.suspended`` (with the
    run, the stage and the attempt, ``Lifecycle.stage_suspended``)."""

    step: str = Field(
        description="the journal key of the suspending step (an ``after_signal`` gate's: the "
        "signal name)"
    )
    until: datetime | None = Field(
        default=None, description="the time it waits until (a sleep's wake, a wait's timeout)"
    )
    waiting_for: str = Field(description="reason:name, as the stage's ``waiting_for``")


class SnapshotStage(BaseModel):
    """One stage of the run, with its step ledger and staged business events."""

    id: str
    status: StageStatus
    attempt: int = 0
    suspensions: int = Field(default=0, description="suspensions within the current attempt")
    output: Any = Field(default=None, description="JSON or a spill reference (blob stays put)")
    has_output: bool = False
    error: ErrorInfo | None = None
    compensation_error: ErrorInfo | None = None
    completed_order: int | None = None
    waiting_for: str | None = None
    wake_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    steps: list[SnapshotStep] = Field(default_factory=list)
    staged_events: list[dict[str, Any]] = Field(
        default_factory=list, description="business events emitted, released on completion"
    )
    suspended_in: SnapshotWait | None = Field(
        default=None,
        description="the wait of the last ``stage.suspended`` the source emitted for the "
        "current attempt (whether it is still there or not); None: the attempt did not "
        "suspend, or the source does not say (a snapshot from before 2026-12-07, or one "
        "whose step the source could not tell): the import rules read the journal instead",
    )


class RunSnapshot(BaseModel):
    """The portable state of a run, for moving it between drivers (format version 1).

    Taken at a safe point (pending, suspended, or between stages), so no stage body is
    executing. A stage may still read ``running``: its attempt started (``stage.started`` was
    emitted) but nobody runs it (a lost worker's attempt, or one whose job or activity no worker
    had picked up); the target continues that attempt from its ledger, without a second
    ``stage.started``.
    Values are JSON or spill references into the shared blob store; ``event_seq`` is the last
    sequence number used by the source *including* the ``run.migrated`` event it emits when the
    move completes, so the target continues at ``event_seq + 1``.
    """

    format: Literal["wfe.run-snapshot"] = "wfe.run-snapshot"
    format_version: Literal[1] = 1
    run_id: str
    workflow_id: str
    version: str
    status: RunStatus
    input: Any = Field(description="the validated input (JSON or a spill reference)")
    idempotency_key: str | None = None
    input_fingerprint: str | None = None
    graph: dict[str, Any] | None = Field(
        default=None, description="the definition snapshot (GraphModel JSON)"
    )
    current_group: int = 0
    completed_count: int = 0
    stages: list[SnapshotStage]
    signals: list[SnapshotSignal] = Field(
        default_factory=list,
        description="buffered signals not yet consumed, in arrival order (each wait for a "
        "name takes the oldest of that name)",
    )
    signal_keys: list[str] = Field(
        default_factory=list,
        description="every signal idempotency key seen by the run (consumed or buffered): a "
        "repeat of one is not queued again",
    )
    event_seq: int = 0
    redrive_count: int = 0
    redrive_history: list[dict[str, Any]] = Field(
        default_factory=list, description="archived stage records superseded by redrives"
    )
    deadline: datetime | None = Field(default=None, description="the run timeout's deadline")
    created_at: datetime | None = None
    source: str | None = Field(default=None, description="the driver the snapshot came from")

    @model_validator(mode="before")
    @classmethod
    def _older_signal_forms(cls, data: Any) -> Any:
        """Snapshots written before signals queued held ``signals`` as a dict of one payload
        per name (and ``consumed_signals``, names already consumed, which no longer mean
        anything): read them as a queue of one signal per name."""
        if isinstance(data, dict):
            signals = data.get("signals")
            if isinstance(signals, dict) or "consumed_signals" in data:
                data = dict(data)
                data.pop("consumed_signals", None)
                if isinstance(signals, dict):
                    data["signals"] = [
                        {"name": name, "payload": payload} for name, payload in signals.items()
                    ]
        return data
