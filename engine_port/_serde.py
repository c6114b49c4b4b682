"""JSON serialisation of user values (pydantic; JSON only, never pickle)."""

from __future__ import annotations

import functools
import hashlib
import math
from typing import Any

import pydantic_core
from pydantic import TypeAdapter

from .errors import SerializationError

__all__ = [
    "JSON",
    "dumps",
    "fingerprint",
    "input_fingerprint",
    "loads",
    "to_json_value",
    "validate_as",
]

JSON = Any  # a value made only of dict/list/str/int/float/bool/None


def _check(value: Any, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise SerializationError(f"{path} contains {value!r}, which JSON cannot carry")
    if isinstance(value, dict):
        for k, v in value.items():
            _check(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]")


def to_json_value(value: Any, what: str) -> JSON:
    """Turn a user value (pydantic model, dataclass, dict, ...) into plain JSON data.

    Raises :class:`SerializationError` naming ``what`` when the value is not JSON-serialisable.
    """
    try:
        plain = pydantic_core.to_jsonable_python(value)
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what} is not JSON-serialisable ({type(value).__name__}): {exc}; return pydantic "
            "models, dataclasses, dicts, lists, strings, numbers, booleans or None"
        ) from None
    _check(plain, what)
    return plain


@functools.lru_cache(maxsize=512)
def _cached_adapter(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


def _adapter(tp: Any) -> TypeAdapter[Any]:
    try:
        return _cached_adapter(tp)
    except TypeError:  # unhashable annotation: build it uncached
        return TypeAdapter(tp)


def validate_as(tp: Any, value: JSON) -> Any:
    """Validate plain JSON data into ``tp`` (``Any`` returns the data as is)."""
    if tp is Any or tp is None:
        return value
    return _adapter(tp).validate_python(value)


def dumps(value: JSON) -> bytes:
    return pydantic_core.to_json(value)


def loads(data: bytes | str) -> JSON:
    return pydantic_core.from_json(data)


def fingerprint(value: JSON) -> str:
    """A stable hash of JSON data (keys sorted), for idempotency comparisons."""
    import json

    canon = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()


def input_fingerprint(workflow_id: str, value: JSON) -> str:
    """The fingerprint idempotency keys compare (the same on every driver)."""
    return fingerprint({"workflow": workflow_id, "input": value})
