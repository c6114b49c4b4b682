"""create_engine: build the driver the settings name (any installed ``wfe.drivers`` entry)."""

from __future__ import annotations

from typing import Any

from ._blobs import BlobStore
from ._clock import Clock
from ._config import load_settings
from ._drivers import load_driver
from ._engine import WorkflowEngine
from ._events import EventSink
from ._registry import Registry
from ._settings import EngineSettings

__all__ = ["create_engine"]


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
    # (from WFE_ variables and wfe.toml: a bad one is a ConfigurationError, never pydantic's)
    settings = settings or load_settings()
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
    factory = load_driver(settings.driver)
    engine: WorkflowEngine = factory(
        settings,
        registry,
        event_sink=event_sink,
        blob_store=blob_store,
        clock=clock,
        **driver_options,
    )
    return engine
