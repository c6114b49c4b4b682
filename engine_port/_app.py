"""Load a user's registry from ``module:attribute`` (a Registry, or a callable returning one)."""

from __future__ import annotations

import importlib

from ._registry import Registry
from .errors import EngineError

__all__ = ["load_registry"]


def load_registry(app: str | None) -> Registry:
    if not app:
        raise EngineError(
            "no application given; pass --app module:registry or set WFE_APP (or app= in "
            "wfe.toml) to the Registry that holds your workflows"
        )
    module_name, _, attr = app.partition(":")
    if not module_name or not attr:
        raise EngineError(f"app {app!r} must look like 'package.module:registry'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineError(f"cannot import {module_name!r} for app {app!r}: {exc}") from None
    target = getattr(module, attr, None)
    if target is None:
        raise EngineError(f"module {module_name!r} has no attribute {attr!r} (app {app!r})")
    registry = target if isinstance(target, Registry) else target()
    if not isinstance(registry, Registry):
        raise EngineError(f"app {app!r} is not a Registry nor a function returning one")
    return registry
