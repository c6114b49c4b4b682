"""The driver interface: what a driver implements and what it may use from the port.

A driver is a package with an entry point in the ``wfe.drivers`` group::

    [project.entry-points."wfe.drivers"]
    mine = "my_driver:create_engine"

whose target is a :class:`DriverFactory`: called as ``factory(settings, registry, *,
event_sink=..., blob_store=..., clock=..., **options)``, it returns a :class:`WorkflowEngine`
subclass (the abstract methods are the contract, DESIGN §5 the behaviour, the conformance
suite the proof). An option it does not support raises ``UnsupportedFeatureError``.

A driver imports only ``engine_port`` (the public API), ``engine_port.errors`` and this module,
never ``engine_port._*``; import-linter holds drivers to that (pyproject ``[tool.importlinter]``)
and tests/unit/test_driver_interface.py freezes the names below. They are:

- what a driver implements: ``WorkflowEngine``, ``DriverFactory``;
- how drivers are found: ``ENTRY_POINT_GROUP``, ``DriverEntry``, ``installed_drivers``;
- the shared rules, one copy every driver calls: the status sets, ``RetryModel.delay_s``
  (``Retry.delay_after``), ``redrive_plan``, ``repin_plan`` (a redrive of a run that
  has not ended: a re-pin to another version), ``sink_retry_delay``, ``version_key``,
  ``start_definition`` (which definition a ``start()`` runs), and the argument checks
  ``check_*`` (typed errors, one message per problem; ``check_signal_known`` with
  ``served_graph`` refuses a signal name no stage of the run's version declares), and
  ``log_dead_letter`` (the warning for an event given up) and ``DeadLetterLog`` (a few such
  warnings per batch of ``DeadLetteredEvent``, the rest at DEBUG and one summary line),
  ``AbandonedAttempts`` (one WARNING per outage of the engine's storage, not one per
  abandoned attempt), ``keyed_repeat``
  (a start whose idempotency key names a run that moved away raises, naming where it went),
  ``frozen_run_error`` (a signal or cancel of a run frozen for a move: retry, or finish or
  abort the move an interrupted migration left);
- ``telemetry``: the OpenTelemetry hooks: decorate ``start()`` with ``traced_start`` and
  ``signal()`` with ``traced_signal``, store ``current_traceparent()`` (taken in ``start()``)
  with the run and give it back as ``StageRequest.trace_context``; the StageRunner makes the
  stage, compensation and step spans;
- the import rules for stages suspended in a signal wait (``at_its_wait``,
  ``announced_suspension``) and what an export tells them, the wait of the attempt's last
  emitted suspension (``SnapshotStage.suspended_in``: ``wait_of_suspension`` finds it from an
  emitted ``stage.suspended`` id, ``current_wait`` for a stage suspended right now);
- storage, serialisation and secrets helpers (``ClaimCheck``, ``check_key``,
  ``delete_prefixes``, ``fingerprint``, ``redact_url``, ...), the snapshot models,
  ``StepEntry`` (a journaled step as ``wfe show --steps`` lists it), and the
  ports a factory receives (``EngineSettings``, ``Registry``, ``EventSink``, ``BlobStore``,
  ``Clock``).
"""

from __future__ import annotations

from typing import Any, Protocol

from . import _telemetry as telemetry
from ._blobs import BlobStore, ClaimCheck, check_key
from ._blobstores import delete_prefixes, open_blob_store
from ._clock import Clock, SystemClock
from ._dead_letters import DeadLetteredEvent, DeadLetterLog, log_dead_letter
from ._drivers import ENTRY_POINT_GROUP, DriverEntry, installed_drivers
from ._engine import WorkflowEngine
from ._events import EventSink, publish_to_sink
from ._faults import describe_fault, is_storage_fault
from ._graph import GraphModel, RetryModel, StageSpec
from ._history import StepEntry
from ._imported import announced_suspension, at_its_wait
from ._limits import (
    check_events_call,
    check_export_target,
    check_import_call,
    check_list_call,
    check_new_run_id,
    check_numbers,
    check_page_call,
    check_purge_call,
    check_run_call,
    check_signal_call,
    check_start_call,
    check_start_input,
    check_version,
    check_wait_call,
    check_wait_seconds,
    check_worker_options,
    check_workflow_id,
    check_workflow_ids,
    safe_error_message,
)
from ._migration import check_import_blobs, frozen_run_error, keyed_repeat
from ._models import (
    ACTIVE_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    SnapshotSignal,
    SnapshotStage,
    SnapshotStep,
    SnapshotWait,
)
from ._payload_limit import check_payload_size
from ._registry import Registry
from ._rules import (
    REDRIVABLE_RUN_STATUSES,
    WORKING_RUN_STATUSES,
    redrive_plan,
    repin_plan,
    sink_retry_delay,
    start_definition,
    version_key,
)
from ._runner import AbandonedAttempts
from ._secrets import SecretUrl, redact_text, redact_url
from ._serde import fingerprint, input_fingerprint, to_json_value
from ._settings import EngineSettings
from ._signal_names import check_signal_known, served_graph
from ._suspended_in import current_wait, wait_of_suspension
from .errors import UnsupportedFeatureError

__all__ = [
    "ACTIVE_RUN_STATUSES",
    "ENTRY_POINT_GROUP",
    "REDRIVABLE_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "WORKING_RUN_STATUSES",
    "AbandonedAttempts",
    "BlobStore",
    "ClaimCheck",
    "Clock",
    "DeadLetterLog",
    "DeadLetteredEvent",
    "DriverEntry",
    "DriverFactory",
    "EngineSettings",
    "EventSink",
    "GraphModel",
    "Registry",
    "RetryModel",
    "SecretUrl",
    "SnapshotSignal",
    "SnapshotStage",
    "SnapshotStep",
    "SnapshotWait",
    "StageSpec",
    "StepEntry",
    "SystemClock",
    "UnsupportedFeatureError",
    "WorkflowEngine",
    "announced_suspension",
    "at_its_wait",
    "check_events_call",
    "check_export_target",
    "check_import_blobs",
    "check_import_call",
    "check_key",
    "check_list_call",
    "check_new_run_id",
    "check_numbers",
    "check_page_call",
    "check_payload_size",
    "check_purge_call",
    "check_run_call",
    "check_signal_call",
    "check_signal_known",
    "check_start_call",
    "check_start_input",
    "check_version",
    "check_wait_call",
    "check_wait_seconds",
    "check_worker_options",
    "check_workflow_id",
    "check_workflow_ids",
    "current_wait",
    "delete_prefixes",
    "describe_fault",
    "fingerprint",
    "frozen_run_error",
    "input_fingerprint",
    "installed_drivers",
    "is_storage_fault",
    "keyed_repeat",
    "log_dead_letter",
    "open_blob_store",
    "publish_to_sink",
    "redact_text",
    "redact_url",
    "redrive_plan",
    "repin_plan",
    "safe_error_message",
    "served_graph",
    "sink_retry_delay",
    "start_definition",
    "telemetry",
    "to_json_value",
    "version_key",
    "wait_of_suspension",
]


class DriverFactory(Protocol):
    """What a ``wfe.drivers`` entry point names: builds an unconnected engine."""

    def __call__(
        self,
        settings: EngineSettings,
        registry: Registry,
        *,
        event_sink: EventSink | None = None,
        blob_store: BlobStore | None = None,
        clock: Clock | None = None,
        **options: Any,
    ) -> WorkflowEngine: ...
