"""Installed drivers: every name in the ``wfe.drivers`` entry-point group.

A driver is a package with an entry point ``NAME = "module:factory"`` in the ``wfe.drivers``
group; ``factory(settings, registry, *, event_sink, blob_store, clock, **options)`` returns a
``WorkflowEngine`` (see :mod:`engine_port.driver`). The port never imports a driver by name:
it loads the entry point the settings name, when an engine is built.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import DriverUnavailableError

__all__ = ["ENTRY_POINT_GROUP", "DriverEntry", "find_driver", "installed_drivers", "load_driver"]

ENTRY_POINT_GROUP = "wfe.drivers"


@dataclass(frozen=True)
class DriverEntry:
    """One installed driver: its name, ``module:factory`` and how to install what it needs."""

    name: str
    value: str
    install_hint: str

    @property
    def module(self) -> str:
        return self.value.partition(":")[0]


def _builtin(name: str, value: str, extra: str) -> DriverEntry:
    return DriverEntry(name, value, f"install them with: pip install 'wfe[{extra}]'")


# The drivers shipped in the wfe distribution, registered in pyproject.toml under
# [project.entry-points."wfe.drivers"]. Listed here too for an installation whose metadata
# predates the group (an editable install made before it existed), and so that an engine of a
# shipped driver is built without reading every installed package's metadata (~20 ms a read
# here, three reads an engine: most of what create_engine took). A shipped name always means
# the shipped driver; another package's driver takes a name of its own.
_SHIPPED: Mapping[str, DriverEntry] = MappingProxyType(
    {
        "native": _builtin("native", "driver_native:create_native_engine", "postgres"),
        "temporal": _builtin("temporal", "driver_temporal:create_temporal_engine", "temporal"),
        "memory": _builtin("memory", "driver_memory:create_memory_engine", "postgres"),
    }
)

# packages whose broken imports are bugs to show, never a missing install to hint at
_OWN_PACKAGES = frozenset(
    {"engine_port", "driver_native", "driver_temporal", "driver_memory", "conformance"}
)


def installed_drivers() -> Mapping[str, DriverEntry]:
    """Driver name -> entry, read from the installed packages' metadata on every call."""
    found = dict(_SHIPPED)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _SHIPPED:
            continue  # (a shipped name is the shipped driver: ``_SHIPPED``)
        dist = ep.dist.name if ep.dist is not None else "the package that provides it"
        found[ep.name] = DriverEntry(ep.name, ep.value, f"reinstall {dist}")
    return MappingProxyType(found)


def find_driver(name: str) -> DriverEntry | None:
    """The installed driver ``name`` (None: there is none); a shipped one without reading
    the installed packages' metadata."""
    shipped = _SHIPPED.get(name)
    return shipped if shipped is not None else installed_drivers().get(name)


def unknown_driver_message(name: str, installed: Mapping[str, DriverEntry]) -> str:
    close = difflib.get_close_matches(name, list(installed), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (
        f"unknown driver {name!r}; {hint}installed drivers: {', '.join(sorted(installed))} "
        f"(a package adds one with a {ENTRY_POINT_GROUP!r} entry point)"
    )


def _missing_dependency(exc: ImportError, module_name: str) -> bool:
    """True when the import failed because a package is not installed (the driver package
    itself, or a third-party dependency), False for a broken import inside our own code."""
    if exc.name is None:
        return False
    if exc.name == module_name:
        return True
    return exc.name.split(".")[0] not in _OWN_PACKAGES


def load_driver(name: str) -> Callable[..., Any]:
    """The factory of the installed driver ``name``; DriverUnavailableError when there is no
    such driver or its dependencies are not installed."""
    entry = find_driver(name)
    if entry is None:
        raise DriverUnavailableError(unknown_driver_message(name, installed_drivers()))
    module_name, _, attr = entry.value.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if not _missing_dependency(exc, module_name):
            raise  # a bug inside the driver (or the port), not a missing install
        raise DriverUnavailableError(
            f"the {name} driver needs packages that are not installed ({exc.name}); "
            f"{entry.install_hint}"
        ) from None
    factory: Any = module
    for part in attr.split(".") if attr else ():
        factory = getattr(factory, part)
    if not callable(factory):
        raise DriverUnavailableError(
            f"the {name} driver's entry point {entry.value!r} is not a factory function; "
            f"point the {ENTRY_POINT_GROUP!r} entry point {name!r} at one"
        )
    return factory  # type: ignore[no-any-return]
