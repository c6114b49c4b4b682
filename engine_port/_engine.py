"""The WorkflowEngine port: what every driver implements."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from types import TracebackType
from typing import Any, Self

from ._blobs import BlobStore
from ._graph import Workflow
from ._history import StepEntry
from ._models import Event, FlushResult, RunInfo, RunSnapshot, RunStatus, SignalResult, VersionInfo
from ._registry import Registry
from .errors import UnsupportedFeatureError

__all__ = ["WorkflowEngine"]


class WorkflowEngine(abc.ABC):
    """One engine API, several drivers. Use as ``async with engine: ...``."""

    driver_name: str = "abstract"

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    @property
    def spill_store(self) -> BlobStore | None:
        """The blob store this engine spills values over ``spill_threshold_bytes`` into,
        once connected (None: the driver does not say). The migration tool copies a run's
        spilled values from the source's into the target's when they differ."""
        return None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def connect(self) -> None:
        """Connect (and migrate the schema if needed)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def start(
        self,
        workflow: str | Workflow[Any],
        input: Any,
        *,
        idempotency_key: str | None = None,
        version: str | None = None,
    ) -> RunInfo:
        """Start a run of the registry's latest (or the given) version of ``workflow``."""

    @abc.abstractmethod
    async def get_run(self, run_id: str) -> RunInfo: ...

    @abc.abstractmethod
    async def list_runs(
        self,
        *,
        workflow_id: str | None = None,
        status: RunStatus | Sequence[RunStatus] | None = None,
        limit: int = 100,
        id_prefix: str | None = None,
        outputs: bool = True,
    ) -> list[RunInfo]:
        """Runs, newest first. ``id_prefix`` keeps the runs whose id starts with it;
        ``outputs=False`` lists without reading values (``input``, ``output`` and the stages'
        outputs are None), so a listing never reads the blob store and never fails on a
        missing blob."""

    @abc.abstractmethod
    async def wait(self, run_id: str, timeout: float | None = None) -> RunInfo:
        """Wait until the run is terminal; raise WaitTimeoutError after ``timeout`` seconds."""

    @abc.abstractmethod
    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, idempotency_key: str | None = None
    ) -> SignalResult:
        """Send signal ``name`` with ``payload`` (JSON) to the run.

        Signals of one name queue per run in arrival order; each ``wait_for_signal(name)``
        takes the next one, so nothing is dropped. ``delivered`` says whether it went to a
        step waiting for it at that moment (else it was buffered for a later wait). A repeat
        of ``idempotency_key`` (a non-empty string of at most 300 characters) in the same run
        is not queued again and reports ``already_completed=True``. Unknown run:
        RunNotFoundError; terminal run: RunNotActiveError."""

    @abc.abstractmethod
    async def cancel(self, run_id: str) -> RunInfo: ...

    @abc.abstractmethod
    async def redrive(
        self, run_id: str, from_: str = "last_failure", *, version: str | None = None
    ) -> RunInfo:
        """Re-run a terminal run under the same id from ``last_failure``, ``start`` or a
        stage id; ``version="latest"`` (or a version's name) re-pins it to that version.

        A run that has not ended (pending, or suspended: a stage waiting for a signal or a
        timer, or between stages) takes only ``version=``: it is re-pinned without running
        anything again (completed stages and outputs, the suspended stage's journal and wait,
        queued signals and the run id stay; the next attempt or resume runs the new version's
        bodies from the top with the journaled steps) and ``run.redriven`` is emitted. This
        frees a run stranded on a version no worker serves any more. Refused: a version
        whose stages or dependencies differ, or a ``from_`` (InvalidRedriveError); a stage
        attempt running now (RunNotActiveError: wait, or cancel); a run frozen for a
        migration (MigrationError). Re-pinning to the run's own version does nothing."""

    @abc.abstractmethod
    async def list_versions(self) -> list[VersionInfo]: ...

    async def steps(self, run_id: str) -> list[StepEntry]:
        """The run's journaled durable steps, without their results (``wfe show --steps``),
        sorted by (stage, name): a stage's under its id, its compensation's under
        ``<stage id>#compensation``. After a redrive: the steps a re-run stage journaled
        (from the last failure, with those it had; from a stage or the start, anew) and the
        kept stages' earlier ones. Unknown run: RunNotFoundError."""
        raise UnsupportedFeatureError(f"the {self.driver_name} driver does not list steps")

    @abc.abstractmethod
    async def export_run(self, run_id: str, *, wait: float = 0.0) -> RunSnapshot:
        """Freeze the run at a safe point (pending, suspended, between stages) and return its
        snapshot. A running stage is waited for up to ``wait`` seconds, else MigrationError.
        The run stays frozen (no stage starts, signals are refused) until
        :meth:`complete_export` or :meth:`abort_export`. Exporting a frozen run again returns
        the same snapshot."""

    async def complete_export(self, run_id: str, target: str) -> RunInfo:
        """Mark an exported run ``migrated`` (terminal here, pointing at ``target``) and emit
        ``run.migrated``."""
        raise UnsupportedFeatureError(f"the {self.driver_name} driver cannot migrate runs")

    async def drain(self, workflow_ids: Sequence[str], target: str | None) -> None:
        """Stop taking new runs of ``workflow_ids`` here (``start`` raises
        WorkflowDrainedError naming ``target``); ``target=None`` lifts the drain."""
        raise UnsupportedFeatureError(f"the {self.driver_name} driver cannot drain workflows")

    async def abort_export(self, run_id: str) -> None:
        """Unfreeze an exported run that did not move."""
        raise UnsupportedFeatureError(f"the {self.driver_name} driver cannot migrate runs")

    @abc.abstractmethod
    async def import_run(self, snapshot: RunSnapshot | Mapping[str, Any]) -> RunInfo:
        """Create the run from a snapshot (what ``export_run`` returned, or its JSON form
        ``model_dump(mode="json")``) and resume it; importing a run that is already here
        returns it (a rerun migration never duplicates)."""

    @abc.abstractmethod
    def worker(self, **options: Any) -> AbstractAsyncContextManager[Any]:
        """A worker host for this process, as an async context manager."""

    async def flush_events(self) -> FlushResult:
        """Deliver pending events to the sink now (drivers may also do this in the worker)."""
        return FlushResult()

    async def replay_dlq(self) -> int:
        """Re-queue dead-lettered events; returns how many."""
        return 0

    async def purge(self, older_than: timedelta | float) -> int:
        """Delete the runs that finished more than ``older_than`` (a timedelta, or seconds)
        ago, with everything under them (rows, events, blobs); returns how many. Active runs
        are never touched. The ``retention`` setting makes hosts do this as they go."""
        raise UnsupportedFeatureError(f"the {self.driver_name} driver cannot purge runs")

    async def dead_letters(self, limit: int = 1000) -> list[Event]:
        """Dead-lettered events (the sink refused them too often), oldest first;
        :meth:`replay_dlq` queues them again."""
        raise UnsupportedFeatureError(f"the {self.driver_name} driver keeps no dead letters")
