"""Loading EngineSettings with errors a person can act on: one line per problem, naming where the
value came from (a ``WFE_`` variable, a ``wfe.toml`` key, an argument) and what is valid."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from ._settings import EngineSettings
from .errors import ConfigurationError

__all__ = ["load_settings"]

TOML_FILE = "wfe.toml"


def load_settings(**values: Any) -> EngineSettings:
    """``EngineSettings(**values)`` (then ``WFE_`` variables, then ``wfe.toml``), raising
    ConfigurationError instead of pydantic's multi-line ValidationError."""
    toml = _read_toml()
    try:
        return EngineSettings(**values)
    except ValidationError as exc:
        problems = [_describe(err, values, toml) for err in exc.errors()]
        raise ConfigurationError("; ".join(problems)) from None
    except SettingsError as exc:
        # a setting whose value is a JSON document (routes) that does not parse
        found = re.search(r'field "(\w+)"', str(exc))
        field = found.group(1) if found else "?"
        raise ConfigurationError(
            f"{_source(field, values, toml)} is not valid JSON; give it as a JSON document "
            f"of the setting's shape ({field}: {_shape(field)})"
        ) from None


def _read_toml() -> dict[str, Any]:
    path = Path(TOML_FILE)
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(
            f"{path.resolve()} is not valid TOML ({exc}); fix it or remove it"
        ) from None


def _shape(field: str) -> str:
    """A setting's type as a person reads it (``dict[str, str]``)."""
    info = EngineSettings.model_fields.get(field)
    return "unknown" if info is None else str(info.annotation).removeprefix("typing.")


def _source(field: str, values: dict[str, Any], toml: dict[str, Any]) -> str:
    if field in values:
        return f"the {field!r} argument"
    env = f"WFE_{field.upper()}"
    if env in os.environ:
        return f"environment variable {env}"
    if field in toml:
        return f"{TOML_FILE} key {field!r}"
    return f"setting {field!r}"


def _describe(err: Any, values: dict[str, Any], toml: dict[str, Any]) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    field = loc[0] if loc else ""
    if err.get("type") == "extra_forbidden":
        if field == "wfe" and isinstance(toml.get("wfe"), dict):
            return (
                f"{TOML_FILE} has a [wfe] table; wfe reads its keys at the top level of "
                f"{TOML_FILE}: remove the [wfe] line"
            )
        where = f"in {TOML_FILE}" if field in toml else "given"
        known = sorted(EngineSettings.model_fields)
        close = difflib.get_close_matches(field, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown setting {field!r} {where}; {hint}valid settings: {', '.join(known)}"
    # never echo the rejected value: URLs may carry passwords
    path = ".".join(loc)
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")  # a validator's own words
    return f"{_source(field, values, toml)} is invalid ({path}: {msg})"
