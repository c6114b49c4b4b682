"""create_engine: pick the driver by configuration (an explicit table, no plugin magic)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ._blobs import BlobStore
from ._clock import Clock
from ._engine import WorkflowEngine
from ._events import EventSink
from ._registry import Registry
from ._settings import EngineSettings
from .errors import DriverUnavailableError

__all__ = ["DRIVERS", "create_engine"]

# driver name -> (module, factory function, extra that installs its dependencies)
DRIVERS: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {
        "native": ("driver_native", "create_native_engine", "postgres"),
        "temporal": ("driver_temporal", "create_temporal_engine", "temporal"),
    }
)


_OWN_PACKAGES = frozenset({"engine_port", "driver_native", "driver_temporal", "conformance"})


def _missing_dependency(exc: ImportError, module_name: str) -> bool:
    """True when the import failed because a package is not installed (the driver package
    itself, or a third-party dependency), False for a broken import inside our own code."""
    if exc.name is None:
        return False
    if exc.name == module_name:
        return True
    return exc.name.split(".")[0] not in _OWN_PACKAGES


def create_engine(
    settings: EngineSettings | None = None,
    registry: Registry | None = None,
    *,
    event_sink: EventSink | None = None,
    blob_store: BlobStore | None = None,
    clock: Clock | None = None,
    **driver_options: Any,
) -> WorkflowEngine:
    """Build the engine named by ``settings.driver`` for ``registry``. With ``routes`` set
    (workflow id -> driver), build a routing engine over ``settings.driver`` and every driver
    a route names: new runs go where their workflow is routed, and every other call finds the
    run on whichever driver holds it."""
    settings = settings or EngineSettings()
    registry = registry if registry is not None else Registry()
    if event_sink is None and settings.event_sink:
        from ._events import open_event_sink

        event_sink = open_event_sink(settings.event_sink)
    if settings.routes:
        from ._routing import RoutingEngine

        names: set[str] = {settings.driver, *settings.routes.values()}
        engines: dict[str, WorkflowEngine] = {
            name: _build(
                settings.model_copy(update={"driver": name, "routes": {}}),
                registry,
                event_sink,
                blob_store,
                clock,
                driver_options,
            )
            for name in sorted(names)
        }
        return RoutingEngine(registry, engines, default=settings.driver, routes=settings.routes)
    return _build(settings, registry, event_sink, blob_store, clock, driver_options)


def _build(
    settings: EngineSettings,
    registry: Registry,
    event_sink: EventSink | None,
    blob_store: BlobStore | None,
    clock: Clock | None,
    driver_options: dict[str, Any],
) -> WorkflowEngine:
    try:
        module_name, factory_name, extra = DRIVERS[settings.driver]
    except KeyError:
        raise DriverUnavailableError(
            f"unknown driver {settings.driver!r}; choose one of {sorted(DRIVERS)}"
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if not _missing_dependency(exc, module_name):
            raise  # a bug inside the driver (or the port), not a missing install
        raise DriverUnavailableError(
            f"the {settings.driver} driver needs packages that are not installed ({exc.name}); "
            f"install them with: pip install 'wfe[{extra}]'"
        ) from None
    factory = getattr(module, factory_name)
    engine: WorkflowEngine = factory(
        settings,
        registry,
        event_sink=event_sink,
        blob_store=blob_store,
        clock=clock,
        **driver_options,
    )
    return engine
