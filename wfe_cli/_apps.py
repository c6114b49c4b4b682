"""Load a user's registry from ``--app``: ``module:attribute`` (a Registry, a Workflow, or a
callable returning one) or just ``module`` (its Registry, else every Workflow it defines)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from engine_port import Registry, Workflow
from engine_port.errors import ConfigurationError

__all__ = ["load_registry"]


def _as_registry(target: Any, app: str) -> Registry:
    if isinstance(target, Registry):
        return target
    if isinstance(target, Workflow):
        return Registry([target])
    if callable(target) and not isinstance(target, type):
        try:
            inspect.signature(target).bind()
        except TypeError:
            raise ConfigurationError(
                f"app {app!r} is a function that needs arguments; point --app (or WFE_APP) at "
                "the Registry, or at a function that builds it without arguments"
            ) from None
        except ValueError:
            pass  # (a builtin without a signature: call it and see)
        made = target()
        if inspect.iscoroutine(made):
            made.close()
            raise ConfigurationError(
                f"app {app!r} is an async function; make the function that builds the Registry "
                "a plain def, or point --app at the Registry itself"
            )
        if isinstance(made, Registry | Workflow):
            return _as_registry(made, app)
    raise ConfigurationError(
        f"app {app!r} is not a Registry, a Workflow, nor a function returning one; point "
        "--app (or WFE_APP) at the Registry that holds your workflows"
    )


def load_registry(app: str | None) -> Registry:
    if not app:
        raise ConfigurationError(
            "no application given; pass --app module:registry or set WFE_APP (or app= in "
            "wfe.toml) to the Registry that holds your workflows"
        )
    module_name, _, attr = app.partition(":")
    if not module_name:
        raise ConfigurationError(f"app {app!r} must look like 'package.module:registry'")
    # like `python -m`, the current directory is importable (the app's own folder)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing and (module_name + ".").startswith(missing + "."):
            raise ConfigurationError(
                f"cannot import {module_name!r} for app {app!r}: {exc}; run from the folder "
                "that holds it or add that folder to PYTHONPATH"
            ) from None
        # the app's module was found, and an import inside it failed (a missing dependency)
        raise ConfigurationError(
            f"importing {module_name!r} for app {app!r} failed inside it: {exc}; install what "
            "it imports, or fix that import"
        ) from None
    if attr:
        target = getattr(module, attr, None)
        if target is None:
            raise ConfigurationError(
                f"module {module_name!r} has no attribute {attr!r} (app {app!r})"
            )
        return _as_registry(target, app)
    found = [v for v in vars(module).values() if isinstance(v, Registry)]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ConfigurationError(
            f"module {module_name!r} holds {len(found)} Registry objects; name one: "
            f"--app {module_name}:NAME"
        )
    workflows = [v for v in vars(module).values() if isinstance(v, Workflow)]
    if not workflows:
        raise ConfigurationError(
            f"module {module_name!r} defines no Registry and no Workflow; name one: "
            f"--app {module_name}:NAME"
        )
    return Registry(workflows)
