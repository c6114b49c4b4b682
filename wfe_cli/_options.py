"""What many ``wfe`` commands share: the common options, settings and the app's registry
loaded with errors a person can act on, run id prefixes, durations and status filters."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import typer

from engine_port import EngineSettings, Registry, RunStatus, WorkflowEngine, load_settings
from engine_port.errors import AmbiguousRunIdError, EngineError

from ._apps import load_registry
from ._errors import fail, reported

__all__ = [
    "MAX_LIMIT",
    "AppOpt",
    "DriverOpt",
    "JsonOpt",
    "RunIdArg",
    "app_registry",
    "driver_settings",
    "resolve",
    "seconds",
    "settings",
    "status_list",
]

AppOpt = Annotated[
    str | None,
    typer.Option("--app", help="module:registry, module:workflow or module (or WFE_APP)"),
]
DriverOpt = Annotated[
    str | None, typer.Option("--driver", help="an installed driver: native, temporal, memory, ...")
]
RunIdArg = Annotated[str, typer.Argument(help="a run id, or a unique prefix of one")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (JSON lines for listings)")]
# the largest --limit: a bigger number overflowed the database's integer (a traceback)
MAX_LIMIT = 1_000_000


def settings(driver: str | None = None, **extra: Any) -> EngineSettings:
    """The engine settings: the given values over WFE_* variables, wfe.toml and defaults."""
    values: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if driver:
        values["driver"] = driver
    with reported():
        return load_settings(**values)


def driver_settings(name: str, option: str) -> EngineSettings:
    """The settings with ``driver`` set from an option that names a driver (``--from``,
    ``--to``, ``--target``): an unknown name is one line naming the option."""
    try:
        return load_settings(driver=name)
    except EngineError as exc:
        fail(type(exc)(f"{option} {name!r}: {exc}"))


def app_registry(app: str | None, settings: EngineSettings, required: bool) -> Registry | None:
    """The registry ``--app`` (or the ``app`` setting) names; None when neither names one and
    the command can do without."""
    name = app or settings.app
    if not name and not required:
        return None
    with reported():
        return load_registry(name)


async def resolve(engine: WorkflowEngine, run_id: str) -> str:
    """The full id of the run ``run_id`` names: the id itself, or the one run whose id starts
    with it (listed without reading any value)."""
    found = [r.id for r in await engine.list_runs(id_prefix=run_id, limit=11, outputs=False)]
    if run_id in found or not found:
        return run_id  # exact, or unknown: the command's own call raises RunNotFoundError
    if len(found) > 1:
        raise AmbiguousRunIdError(run_id, found)
    return found[0]


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def seconds(text: str, option: str) -> float:
    """A duration option (``30``, ``30s``, ``5m``, ``12h``, ``7d``, ``1w``) in seconds."""
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(
            f"{text!r} is not a duration; use a number of seconds or e.g. 30m, 12h, 7d",
            param_hint=option,
        )
    value = float(match.group(1)) * _UNIT[match.group(2)]
    if not math.isfinite(value):
        raise typer.BadParameter(f"{text!r} is too long a duration", param_hint=option)
    return value


def status_list(values: list[str] | None) -> list[RunStatus] | None:
    """``--status`` values as run statuses (None for no filter)."""
    if not values:
        return None
    valid = [s.value for s in RunStatus]
    bad = [v for v in values if v not in valid]
    if bad:
        raise typer.BadParameter(
            f"{', '.join(bad)} is not a run status; use one of {', '.join(valid)}",
            param_hint="--status",
        )
    return [RunStatus(v) for v in values]
