"""Freezes the public surface: adding or removing a public name must be a deliberate change
to this file too."""

from __future__ import annotations

import importlib

import pytest

import engine_port
from engine_port import authoring, calling, errors

# engine_port.authoring: what a workflow author uses
AUTHORS = [
    "GraphModel",
    "NonRetryableError",
    "Registry",
    "Retry",
    "Stage",
    "StageContext",
    "StageSpec",
    "Steps",
    "SyncSteps",
    "Workflow",
]

# engine_port.calling: what an application that starts, signals, inspects, migrates runs uses
CALLERS = [
    "BlobStore",
    "Clock",
    "DEFAULT_SPILL_THRESHOLD",
    "EngineError",
    "EngineMetrics",
    "EngineSettings",
    "ErrorInfo",
    "Event",
    "EventSink",
    "FakeClock",
    "FlushResult",
    "FolderBlobStore",
    "JsonlFileSink",
    "MemoryBlobStore",
    "MemorySink",
    "MigrationReport",
    "RoutingEngine",
    "RunInfo",
    "RunMove",
    "RunSnapshot",
    "RunStatus",
    "SecretUrl",
    "SignalResult",
    "StageInfo",
    "StageStatus",
    "SystemClock",
    "VersionInfo",
    "WorkflowEngine",
    "abort_migration",
    "attach_metrics",
    "copy_blobs",
    "create_engine",
    "load_settings",
    "migrate_run",
    "migrate_runs",
    "open_blob_store",
    "open_event_sink",
    "redact_url",
    "serve_metrics",
]

# top-level names for driver authors (engine_port.driver declares the rest of the interface)
DRIVER_AUTHORS = [
    "Abandoned",
    "ClaimCheck",
    "Completed",
    "EventDraft",
    "Failed",
    "InMemoryLedger",
    "Lifecycle",
    "Outcome",
    "StageRequest",
    "StageRunner",
    "StepLedger",
    "StepRecord",
    "Suspended",
    "box_inline",
    "event_id",
    "is_spill_ref",
    "run_output",
    "run_prefix",
]

PUBLIC = [*AUTHORS, *CALLERS, *DRIVER_AUTHORS]

ERRORS = [
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


def test_engine_port_public_names_are_frozen() -> None:
    assert sorted(engine_port.__all__) == sorted(PUBLIC)
    assert len(engine_port.__all__) == len(set(engine_port.__all__))


def test_each_audience_has_its_own_frozen_list() -> None:
    assert sorted(authoring.__all__) == sorted(AUTHORS)
    assert sorted(calling.__all__) == sorted(CALLERS)
    rest = set(engine_port.__all__) - set(authoring.__all__) - set(calling.__all__)
    assert sorted(rest) == sorted(DRIVER_AUTHORS)
    assert not set(AUTHORS) & set(CALLERS)  # one audience per name


@pytest.mark.parametrize("module", [authoring, calling], ids=["authoring", "calling"])
def test_an_audience_module_gives_the_same_objects_as_engine_port(module: object) -> None:
    for name in module.__all__:  # type: ignore[attr-defined]
        assert getattr(module, name) is getattr(engine_port, name)


def test_error_names_are_frozen() -> None:
    public = sorted(n for n in errors.__all__ if not n.startswith("_"))
    assert public == sorted(ERRORS)
    assert len(errors.__all__) == len(set(errors.__all__))


@pytest.mark.parametrize("name", [n for n in ERRORS if n != "EngineError"])
def test_every_error_is_an_engine_error(name: str) -> None:
    cls = getattr(errors, name)
    assert isinstance(cls, type)
    assert issubclass(cls, errors.EngineError)
    assert cls is not errors.EngineError


def test_engine_error_is_an_exception() -> None:
    assert issubclass(errors.EngineError, Exception)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_importable(name: str) -> None:
    module = importlib.import_module("engine_port")
    assert getattr(module, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from engine_port import {name}", namespace)
    assert namespace[name] is getattr(engine_port, name)


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from engine_port.errors import {name}", namespace)
    assert namespace[name] is getattr(errors, name)


def test_the_errors_exported_at_top_level_are_the_same_objects() -> None:
    assert engine_port.EngineError is errors.EngineError
    assert engine_port.NonRetryableError is errors.NonRetryableError


def test_importing_engine_port_imports_no_driver() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, engine_port, engine_port.errors\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('driver_native', 'driver_temporal', 'temporalio', 'sqlalchemy', 'minio'))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == ""
