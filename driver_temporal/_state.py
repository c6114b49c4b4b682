"""Typed models of the state a run keeps: ``StageState``, one stage's record (the workflow's
per-stage state, the ``stages`` of a start document and of the final state ``wfe.save_state``
stores), and ``RunMemo``, the ``wfe_run`` memo entry (the RunInfo ``get_run`` reads with no
worker up).

Replay safety: runs started by older code carry these as JSON, and a run's history must replay
identically, so each model reads every shape those wrote and writes back the very same JSON:
``to_json`` dumps the keys that were given (in field order) and no other (a start document's
stage entry holds a few keys, a redrive's three; an engine's first memo a handful), extra keys
included. ``tests/unit/test_temporal_state.py`` checks the round trip on recorded shapes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

__all__ = ["MemoStage", "RunMemo", "StageState"]


class StageState(BaseModel):
    """One stage's state. The defaults are what a missing key meant to the code that read
    it (``.get()`` defaults before this model): a stage the start document does not mention
    is pending, at attempt 0, with no steps. The field order is the key order of the JSON the
    workflow saves."""

    model_config = ConfigDict(extra="allow")

    id: str = ""  # (absent in a start document: its key there)
    status: str = "pending"
    attempt: int = 0
    output: Any = None
    error: dict[str, Any] | None = None
    compensation_error: dict[str, Any] | None = None
    waiting_for: str | None = None
    wake_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    order: int | None = None
    steps: dict[str, dict[str, Any]] = {}
    comp_steps: dict[str, dict[str, Any]] = {}
    events: list[dict[str, Any]] = []
    suspensions: int = 0
    backoff: bool = False

    @field_validator("steps", "comp_steps", "events", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any, info: ValidationInfo) -> Any:
        # (the code before this model read these with ``or {}`` / ``or []``)
        if value is None:
            return [] if info.field_name == "events" else {}
        return value

    @classmethod
    def fresh(cls, sid: str, prior: StageState | None) -> StageState:
        """The workflow's state of stage ``sid`` at the run's start: where ``prior`` (the
        start document's entry, if any) left it; a compensation's ledger and the compensation
        error start afresh, and the stage is not backing off."""
        p = prior or cls()
        return cls(
            id=sid,
            status=p.status,
            attempt=p.attempt,
            output=p.output,
            error=p.error,
            compensation_error=None,
            waiting_for=p.waiting_for,
            wake_at=p.wake_at,
            started_at=p.started_at,
            finished_at=p.finished_at,
            order=p.order,
            steps=dict(p.steps),
            comp_steps={},
            events=list(p.events),
            suspensions=p.suspensions,
            backoff=False,
        )

    @property
    def shown(self) -> str:
        """The status readers see: ``pending`` between a failed attempt and its retry (the
        next attempt is scheduled, as on the native driver), else the workflow's own."""
        return "pending" if self.status == "running" and self.backoff else self.status

    def memo(self, *, compact: bool = False) -> MemoStage:
        """The stage as the ``wfe_run`` memo shows it; ``compact`` (runs of
        ``StartDocument.compact_memo``): its id, status and the fields that are set (a reader
        fills in the rest with ``MemoStage``'s defaults). Temporal writes a run's memo again at
        every change of the run: with every field of every stage, a 52-stage run's memo was
        9 KB, mostly nulls."""
        shown = {
            "attempt": self.attempt or None,
            "output": self.output,
            "error": self.error,
            "compensation_error": self.compensation_error,
            "waiting_for": self.waiting_for,
            "wake_at": self.wake_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
        if not compact:
            return MemoStage(id=self.id, status=self.shown, **{**shown, "attempt": self.attempt})
        return MemoStage(
            id=self.id,
            status=self.shown,
            **{k: v for k, v in shown.items() if v is not None},
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON it was read from (or built with): the given keys only."""
        return self.model_dump(mode="json", exclude_unset=True)


class MemoStage(BaseModel):
    """One stage of the ``wfe_run`` memo (a ``StageInfo`` before its output is resolved)."""

    model_config = ConfigDict(extra="allow")

    id: str
    status: str = "pending"
    attempt: int = 0
    output: Any = None
    error: dict[str, Any] | None = None
    compensation_error: dict[str, Any] | None = None
    waiting_for: str | None = None
    wake_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class RunMemo(BaseModel):
    """The ``wfe_run`` memo entry. An engine writes a first one when it starts, redrives or
    imports a run (a few keys); the workflow then writes every key once per activation."""

    model_config = ConfigDict(extra="allow")

    id: str
    workflow_id: str
    version: str
    status: str = "pending"
    input: Any = None  # the stored form (inline or a claim-check reference)
    error: dict[str, Any] | None = None
    compensation_errors: list[dict[str, Any]] = []
    stages: list[MemoStage] = []
    idempotency_key: str | None = None
    redrive_count: int = 0
    created_at: str | None = None
    updated_at: str | None = None
    finished_at: str | None = None
    sinks: list[str] = []
    event_seq: int = 0
    run_started: bool = False
    migrated_to: str | None = None
    frozen: bool = False
    # written by runs that write their memo only when its status (or a stage it waits or
    # failed in, a freeze) changes: while the run is active, its stages are those of that
    # change, and ``get_run`` asks the run for the current ones (``StartDocument.memo_on_change``)
    stages_lag: bool = False

    def to_json(self) -> dict[str, Any]:
        """The memo entry as written: the given keys only (a stage: its given keys)."""
        return self.model_dump(mode="json", exclude_unset=True)
