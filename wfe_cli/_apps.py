"""Load a user's registry from ``--app``: ``module:attribute`` (a Registry, a Workflow, or a
callable returning one) or just ``module`` (its Registry, else every Workflow it defines)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from types import ModuleType
from typing import Any

from engine_port import Registry, Workflow
from engine_port.errors import ConfigurationError

__all__ = ["load_registry"]


def _described(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit (it called sys.exit({exc.code!r}))"
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _where(exc: BaseException) -> str:
    """The innermost frame of the user's code (outside importlib), as ' at FILE:LINE'."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<frozen") and "importlib" not in f.filename
    ]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


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
        try:
            made = target()
        except Exception as exc:
            raise ConfigurationError(
                f"app {app!r}: calling it to build the Registry raised {_described(exc)}; "
                "fix that function, or point --app (or WFE_APP) at the Registry itself"
            ) from None
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


def _check_name(module_name: str, attr: str, app: str) -> None:
    """A module name Python can import: not empty, not a file path, not relative."""
    if not module_name:
        raise ConfigurationError(f"app {app!r} must look like 'package.module:registry'")
    a_file = module_name.endswith(".py") and os.path.isfile(module_name)
    if a_file or "/" in module_name or "\\" in module_name:
        dotted = module_name.removesuffix(".py").strip("./\\").replace("/", ".")
        dotted = dotted.replace("\\", ".")
        raise ConfigurationError(
            f"app {app!r} names a file; name the module instead, as Python imports it: "
            f"--app {dotted}{':' + attr if attr else ''} (run from the folder that holds it)"
        )
    if module_name.startswith("."):
        raise ConfigurationError(
            f"app {app!r} is a relative module name; give the full one, e.g. "
            "'package.module:registry'"
        )


def _import(module_name: str, app: str) -> ModuleType:
    """Import the app's module; any failure is a ConfigurationError saying where and why."""
    try:
        return importlib.import_module(module_name)
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
    except SyntaxError as exc:
        where = f"{exc.filename}, line {exc.lineno}" if exc.filename else module_name
        raise ConfigurationError(
            f"app {app!r}: {module_name!r} has a syntax error ({exc.msg}, {where}); fix it"
        ) from None
    except (Exception, SystemExit) as exc:
        raise ConfigurationError(
            f"app {app!r}: importing {module_name!r} raised {_described(exc)}{_where(exc)}; "
            "fix the module (importing it must not fail), or point --app at another one"
        ) from None


def load_registry(app: str | None) -> Registry:
    if not app:
        raise ConfigurationError(
            "no application given; pass --app module:registry or set WFE_APP (or app= in "
            "wfe.toml) to the Registry that holds your workflows"
        )
    module_name, _, attr = app.partition(":")
    _check_name(module_name, attr, app)
    # like `python -m`, the current directory is importable (the app's own folder)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    module = _import(module_name, app)
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
