"""Freezes the declared driver interface (engine_port.driver) and holds every driver, the
conformance kit and the port to it: adding a name here must be a deliberate change."""

from __future__ import annotations

import ast
import inspect
import tomllib
from pathlib import Path

import pytest

from engine_port import driver
from engine_port._drivers import _SHIPPED, ENTRY_POINT_GROUP

ROOT = Path(__file__).resolve().parents[2]
DRIVER_PACKAGES = ("driver_native", "driver_temporal", "driver_memory")

INTERFACE = [
    "ACTIVE_RUN_STATUSES",
    "AbandonedAttempts",
    "BlobStore",
    "ClaimCheck",
    "Clock",
    "DeadLetterLog",
    "DeadLetteredEvent",
    "DriverEntry",
    "DriverFactory",
    "ENTRY_POINT_GROUP",
    "EngineSettings",
    "EventSink",
    "GraphModel",
    "REDRIVABLE_RUN_STATUSES",
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
    "TERMINAL_RUN_STATUSES",
    "UnsupportedFeatureError",
    "WORKING_RUN_STATUSES",
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
    "keyed_repeat",
    "is_storage_fault",
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
    "to_json_value",
    "telemetry",
    "version_key",
    "wait_of_suspension",
]

# what every driver implements: the port's abstract engine methods (the conformance suite
# proves how they behave)
ENGINE_METHODS = [
    "cancel",
    "close",
    "connect",
    "export_run",
    "get_run",
    "import_run",
    "list_runs",
    "list_versions",
    "redrive",
    "signal",
    "start",
    "wait",
    "worker",
]

# what drivers and the conformance kit may import from the port
PUBLIC_PORT_MODULES = {
    "engine_port",
    "engine_port.authoring",
    "engine_port.calling",
    "engine_port.errors",
    "engine_port.driver",
}


def _python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def test_driver_interface_names_are_frozen() -> None:
    assert sorted(driver.__all__) == sorted(INTERFACE)
    assert len(driver.__all__) == len(set(driver.__all__))


def test_the_engine_methods_every_driver_implements_are_frozen() -> None:
    assert sorted(driver.WorkflowEngine.__abstractmethods__) == ENGINE_METHODS


@pytest.mark.parametrize("name", INTERFACE)
def test_every_interface_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from engine_port.driver import {name}", namespace)
    assert namespace[name] is getattr(driver, name)


@pytest.mark.parametrize("package", [*DRIVER_PACKAGES, "conformance"])
def test_drivers_and_conformance_use_only_the_declared_port(package: str) -> None:
    private = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in _python_files(package)
        for module in _imported_modules(path)
        if module.split(".")[0] == "engine_port" and module not in PUBLIC_PORT_MODULES
    ]
    assert private == [], "import these through engine_port.driver instead"


def test_shipped_drivers_are_the_entry_points_in_pyproject() -> None:
    """The fallback table (for installs whose metadata predates the group) cannot drift."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][ENTRY_POINT_GROUP]
    assert declared == {name: entry.value for name, entry in _SHIPPED.items()}
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    packages = set(wheel["targets"]["wheel"]["packages"])
    assert {entry.module for entry in _SHIPPED.values()} <= packages


@pytest.mark.parametrize("name", sorted(_SHIPPED))
def test_built_in_factories_take_what_create_engine_passes(name: str) -> None:
    factory = driver.installed_drivers()[name]
    module, _, attr = factory.value.partition(":")
    if name == "temporal":
        pytest.importorskip("temporalio")
    fn = getattr(__import__(module), attr)
    params = inspect.signature(fn).parameters
    expected = inspect.signature(driver.DriverFactory.__call__).parameters
    assert list(params)[:2] == ["settings", "registry"]
    for keyword in ("event_sink", "blob_store", "clock"):
        assert params[keyword].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[keyword].default is None
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert set(expected) - {"self"} == set(params)
