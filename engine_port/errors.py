"""Typed errors of the workflow-engine port.

Every error a user can cause is a subclass of :class:`EngineError`. Drivers translate their own
failures into these types so that code written against the port never sees a driver's exception.
Each message says what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousRunIdError",
    "CommandInProgressError",
    "ConfigurationError",
    "DefinitionError",
    "DefinitionVersionConflictError",
    "DriverUnavailableError",
    "EngineError",
    "IdempotencyConflictError",
    "InvalidInputError",
    "InvalidRedriveError",
    "MigrationError",
    "NonRetryableError",
    "PagingUnsupportedError",
    "PayloadTooLargeError",
    "RunExistsError",
    "RunNotActiveError",
    "RunNotFoundError",
    "RunTimeoutError",
    "SerializationError",
    "SignalQueueFullError",
    "SpilledPayloadUnavailableError",
    "StageExitError",
    "StageTimeoutError",
    "StepError",
    "StepTimeoutError",
    "UnknownRedriveStageError",
    "UnknownSignalError",
    "UnsafeBlobKeyError",
    "UnsupportedFeatureError",
    "VersionNotServedError",
    "WaitTimeoutError",
    "WorkflowDrainedError",
    "WorkflowNotFoundError",
]


class EngineError(Exception):
    """Base of every error the engine raises because of something a user did or asked for."""


class DefinitionError(EngineError):
    """A workflow graph is malformed (cycle, unknown or self dependency, duplicate id, empty)."""


class DefinitionVersionConflictError(DefinitionError):
    """One (workflow, version) was registered with two different structures."""

    def __init__(self, workflow_id: str, version: str, *, stored: str | None = None) -> None:
        if stored is None:
            where = "is already registered with a different structure"
        else:  # (the database's definition of it, which its runs were started with)
            where = (
                "has other stages than the definition its runs were started with, which the "
                f"database holds ({stored})"
            )
        super().__init__(
            f"workflow {workflow_id!r} version {version!r} {where}; give the changed definition "
            "a new version= (or drop version= to use the structural hash)"
        )
        self.workflow_id = workflow_id
        self.version = version


class WorkflowNotFoundError(EngineError):
    """The registry has no workflow (or no such version of it)."""

    def __init__(
        self, workflow_id: str, version: str | None = None, *, did_you_mean: str | None = None
    ) -> None:
        what = f"{workflow_id!r}" if version is None else f"{workflow_id!r} version {version!r}"
        hint = f"did you mean {did_you_mean!r}? If not, " if did_you_mean else ""
        super().__init__(
            f"no workflow {what} is registered; {hint}add it to the Registry passed to "
            "create_engine()"
        )
        self.workflow_id = workflow_id
        self.version = version


class InvalidInputError(EngineError):
    """A workflow input failed validation against the workflow's input model, or a value
    given to the engine (an id, name, key or JSON payload) is over a backend's limits.

    With ``workflow_id=None`` the ``detail`` is the whole message (it names the field, the
    limit and what to do); ``fields`` names the offending fields either way."""

    def __init__(self, workflow_id: str | None, detail: str, fields: tuple[str, ...] = ()) -> None:
        if workflow_id is None:
            super().__init__(detail)
        else:
            names = ", ".join(fields) if fields else "the input"
            super().__init__(
                f"input for workflow {workflow_id!r} is invalid ({names}): {detail}; "
                "fix the input so it matches the workflow's input model"
            )
        self.workflow_id = workflow_id
        self.fields = fields


class PayloadTooLargeError(InvalidInputError):
    """A value (run input, signal payload, step result, stage output, event data) over
    max_payload_bytes."""

    def __init__(self, what: str, size: int, limit: int, *, bound: str | None = None) -> None:
        """``bound``: what sets ``limit`` when it is not the ``max_payload_bytes`` setting (a
        backend's own limit, which no setting raises)."""
        advice = (
            "(max_payload_bytes); keep large data in your own store and pass a reference to "
            "it, or raise max_payload_bytes"
            if bound is None
            else f"({bound}); keep large data in your own store and pass a reference to it"
        )
        EngineError.__init__(
            self, f"{what} is {size:,} bytes as JSON, over the limit of {limit:,} bytes {advice}"
        )
        self.workflow_id = ""
        self.fields = (what,)
        self.size = size
        self.limit = limit


class InvalidRedriveError(EngineError):
    """A redrive named an unknown stage, or there is nothing to redrive."""


class UnknownRedriveStageError(InvalidRedriveError, InvalidInputError):
    """A redrive ``from_`` that is neither ``last_failure``, ``start`` nor a stage of the run's
    workflow version: bad input (an :class:`InvalidInputError`), and still an
    :class:`InvalidRedriveError` for code that catches that."""

    def __init__(self, run_id: str, from_: str, stages: list[str]) -> None:
        EngineError.__init__(
            self,
            f"cannot redrive run {run_id!r} from {from_!r}: no such stage; use 'last_failure', "
            f"'start' or one of its stages {stages}",
        )
        self.workflow_id = None
        self.fields = ("from",)
        self.run_id = run_id
        self.from_ = from_
        self.stages = list(stages)


class CommandInProgressError(EngineError):
    """A command with this idempotency key is still running elsewhere."""


class SerializationError(EngineError):
    """A value could not be serialised to JSON (stage output, step result, event data)."""


class RunNotFoundError(EngineError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r}; check the id (list_runs() shows known runs)")
        self.run_id = run_id


class AmbiguousRunIdError(EngineError):
    """A run id prefix matches more than one run."""

    def __init__(self, prefix: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:10]) + (", ..." if len(candidates) > 10 else "")
        super().__init__(
            f"run id prefix {prefix!r} matches {len(candidates)}"
            f"{'+' if len(candidates) > 10 else ''} runs ({shown}); give more characters of the id"
        )
        self.prefix = prefix
        self.candidates = list(candidates)


class UnknownSignalError(EngineError):
    """A signal name that no stage of the run's workflow version waits for."""

    def __init__(self, run_id: str, name: str, known: list[str]) -> None:
        choices = ", ".join(repr(n) for n in known) or "none"
        super().__init__(
            f"cannot signal {name!r} to run {run_id!r}: no stage of its workflow version waits "
            f"for that signal (it declares {choices}); check the name, or declare it with "
            "signals= on the stage that waits for it"
        )
        self.run_id = run_id
        self.name = name
        self.known = list(known)


class RunExistsError(EngineError):
    """A run id a caller chose is taken: by a run of that very id, or (``existing``) of an
    id that differs from it only in case."""

    def __init__(self, run_id: str, existing: str | None = None) -> None:
        if existing is None or existing == run_id:
            super().__init__(
                f"a run with id {run_id!r} already exists; choose another run id, or use an "
                "idempotency key to make repeated starts return the same run"
            )
        else:
            super().__init__(
                f"run id {run_id!r} differs only in case from that of run {existing!r}, which "
                "exists; choose another run id (a run's blobs live under runs/<run id>/, and "
                "on a case-insensitive blob store such as a macOS or Windows folder two such "
                "runs would share one folder: purging one would delete the other's data)"
            )
        self.run_id = run_id
        self.existing = run_id if existing is None else existing


class RunNotActiveError(EngineError):
    """The run is not in a status that accepts the call: an ended run takes no signal or
    cancel, and a run that has not ended takes no redrive but a re-pin, refused while a stage
    attempt runs (``running`` names the stage)."""

    def __init__(
        self,
        run_id: str,
        status: str,
        action: str,
        *,
        migrated_to: str | None = None,
        running: str | None = None,
    ) -> None:
        if action == "redrive" and running is not None:
            # a re-pin (redrive(version=) of a run that has not ended) waits for a safe point
            remedy = (
                f"stage {running!r} is running an attempt now; wait until it suspends or the "
                "run ends (engine.wait), then redrive again, or cancel the run"
            )
        elif action == "redrive" and status in ("pending", "running", "suspended"):
            remedy = (
                "only a completed, failed or cancelled run can be redriven, and one that has "
                "not ended only re-pinned to another version (redrive(run_id, version=...)); "
                "wait for it to end (engine.wait) or cancel it first"
            )
        elif action == "redrive":
            remedy = (
                "only a completed, failed or cancelled run can be redriven; wait for it to end "
                "(engine.wait) or cancel it first"
            )
        elif status == "migrated":
            where = f"to {migrated_to}" if migrated_to else "to another driver"
            remedy = (
                f"it moved {where} (get_run(...).migrated_to); {action} it through that "
                "driver's engine, or a routing engine over both"
            )
        elif status == "compensating":
            remedy = (
                "it is rolling back (a stage failed for good, or it was cancelled) and takes no "
                "more; wait for it to end (engine.wait), then redrive() it to run it again"
            )
        else:
            remedy = "only active runs accept this (use redrive() to re-run a terminal run)"
        super().__init__(f"cannot {action} run {run_id!r}: it is {status}; {remedy}")
        self.run_id = run_id
        self.status = status
        self.migrated_to = migrated_to
        self.running = running


class SignalQueueFullError(EngineError):
    """A run already holds ``max_pending_signals`` signals it has not consumed yet."""

    def __init__(self, run_id: str, name: str, limit: int) -> None:
        super().__init__(
            f"cannot signal {name!r} to run {run_id!r}: it already holds {limit} signals it has "
            "not consumed (max_pending_signals); retry once the workflow has consumed some, "
            "check that it waits for the signals you send, or raise max_pending_signals"
        )
        self.run_id = run_id
        self.name = name
        self.limit = limit


class IdempotencyConflictError(EngineError):
    def __init__(self, key: str, run_id: str) -> None:
        super().__init__(
            f"idempotency key {key!r} already started run {run_id!r} with a different "
            "workflow or input; use a new key for a different request (get_run shows what "
            "that run was started with)"
        )
        self.key = key
        self.run_id = run_id


class NonRetryableError(EngineError):
    """Raise from a stage body to fail the stage at once, without retries."""


class StageExitError(EngineError):
    """A stage body or compensation raised ``SystemExit`` (``sys.exit()``, or a CLI library's
    command called in a stage), or a ``CancelledError`` or ``GeneratorExit`` of its own (the
    engine did not cancel it). The attempt fails with it like with any error (retried under
    the stage's policy; list it in ``Retry(non_retryable=...)`` to stop that) instead of
    ending the worker process, as an activity's does on Temporal, or leaving the stage
    running for ever."""

    def __init__(self, exc: BaseException) -> None:
        if isinstance(exc, SystemExit):
            message = (
                f"the stage body raised SystemExit({exc.code!r}) (sys.exit?); a stage cannot end "
                "the worker process: return a value or raise an exception"
            )
        else:
            message = (
                f"the stage body raised {type(exc).__name__}({str(exc)[:200]!r}) while nothing "
                "cancelled it (a cancelled task or generator of its own?); a stage ends by "
                "returning a value or raising an Exception: catch it, or raise an error of yours"
            )
        super().__init__(message)
        self.__traceback__ = exc.__traceback__


class StepError(EngineError):
    """A durable step was used incorrectly (for example one step name used twice in a stage)."""


class StepTimeoutError(EngineError):
    """A durable wait reached its deadline (fixed when the wait first started)."""


class StageTimeoutError(EngineError):
    """A stage attempt ran longer than its ``timeout``."""


class RunTimeoutError(EngineError):
    """A run ran longer than its run ``timeout`` (the same message on every driver)."""

    def __init__(self, run_id: str, timeout_s: float) -> None:
        super().__init__(
            f"run {run_id!r} ran longer than its timeout of {timeout_s:g}s; raise the "
            "workflow timeout= or speed it up"
        )
        self.run_id = run_id
        self.timeout_s = timeout_s


class WaitTimeoutError(EngineError):
    """``engine.wait()`` gave up before the run reached a terminal status."""


class SpilledPayloadUnavailableError(EngineError):
    def __init__(self, key: str, reason: str | None = None) -> None:
        super().__init__(
            f"spilled payload {key!r} cannot be read: {reason}; the run's stored state was "
            "changed outside the engine"
            if reason
            else f"spilled payload {key!r} is not in the blob store; point blob_url at the "
            "store the run was written with (or copy the blobs across when migrating)"
        )
        self.key = key


class UnsafeBlobKeyError(EngineError):
    def __init__(self, key: str) -> None:
        super().__init__(
            f"blob key {key!r} escapes the blob store root; use a relative key without '..'"
        )
        self.key = key


class UnsupportedFeatureError(EngineError):
    """A driver was asked for an option it does not support (never silently ignored)."""


class PagingUnsupportedError(UnsupportedFeatureError, AttributeError):
    """``list_runs_page`` of a routing engine over a driver that has none (a third-party
    driver): an UnsupportedFeatureError, and an AttributeError so that a caller that probes
    for the method (``getattr(engine, "list_runs_page", None)``, as the web view does) falls
    back to ``list_runs`` as it does for that driver alone."""


class DriverUnavailableError(EngineError):
    """A driver's extra is not installed, or its server cannot be reached."""


class VersionNotServedError(EngineError):
    """No registry here serves the (workflow, version) asked for."""


class WorkflowDrainedError(EngineError):
    """The workflow is draining to another driver: start new runs there."""

    def __init__(self, workflow_id: str, target: str) -> None:
        super().__init__(
            f"workflow {workflow_id!r} is draining to the {target} driver; start new runs "
            f"there (set routes={{{workflow_id!r}: {target!r}}} in the settings)"
        )
        self.workflow_id = workflow_id
        self.target = target


class MigrationError(EngineError):
    """A run could not be exported or imported."""


class ConfigurationError(EngineError):
    """A setting is missing or unusable (a blob_url without credentials, an unknown scheme);
    the message names the setting and how to fix it, with any secret in it redacted."""
