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
    "json_copy",
    "loads",
    "to_json_value",
    "validate_as",
]

JSON = Any  # a value made only of dict/list/str/int/float/bool/None


def _check(value: Any, path: str) -> None:
    """Raise SerializationError naming where plain JSON data ``value`` holds a float JSON
    cannot carry (NaN, infinity). Builds the paths: called once :func:`_finite` said so."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SerializationError(f"{path} contains {value!r}, which JSON cannot carry")
    if isinstance(value, dict):
        for k, v in value.items():
            _check(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check(v, f"{path}[{i}]")


def _finite(plain: Any) -> bool:
    """Whether plain JSON data holds no NaN or infinity: one walk without paths (a path per
    element cost more than the conversion itself for a 10,000-row output)."""
    stack = [plain]
    pop, extend = stack.pop, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is dict:
            extend(v.values())
        elif t is list:
            extend(v)
        elif isinstance(v, float) and not math.isfinite(v):
            return False
    return True


def _json_key(key: Any) -> Any:
    """The JSON object key pydantic writes for the dict key ``key``."""
    return next(iter(pydantic_core.to_jsonable_python({key: None})))


def _string_keyed(value: Any) -> bool:
    """Whether every dict in the plain containers of ``value`` (as given) has only string
    keys: then no two keys can become one JSON key (one walk, no paths)."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        v = pop()
        if isinstance(v, dict):
            for k in v:
                if type(k) is not str:
                    return False
            extend(v.values())
        elif isinstance(v, list | tuple):
            extend(v)
    return True


def _check_keys(value: Any, path: str) -> None:
    """Refuse a dict whose keys turn into one JSON key (``{1: "a", "1": "b"}`` was
    ``{"1": "b"}``, the other value dropped without a word). Walks the plain containers of
    the value as given; pydantic serialisation already bounded their depth. Builds the
    paths: called once :func:`_string_keyed` found a dict with other keys."""
    if isinstance(value, dict):
        if not all(type(k) is str for k in value):
            seen: dict[Any, Any] = {}
            for k in value:
                jk = _json_key(k)
                if jk in seen:
                    raise SerializationError(
                        f"{path} has the keys {seen[jk]!r} and {k!r}, which are both {jk!r} in "
                        "JSON (one value would be lost); give the dict distinct string keys"
                    )
                seen[jk] = k
        for k, v in value.items():
            _check_keys(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_keys(v, f"{path}[{i}]")


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
    if not _finite(plain):
        _check(plain, what)
    if not _string_keyed(value):
        _check_keys(value, what)
    return plain


def json_copy(value: JSON) -> JSON:
    """A copy of plain JSON data that shares no dict or list with ``value`` (strings and
    numbers are immutable: shared). What the engine hands user code (a step's result, a
    signal's payload, an upstream output, the run input) is such a copy: a body that
    changed the value it got changed the journaled record itself (Temporal then journaled
    the changed value, which a replay returned) or the object a sibling stage of the same
    process was handed (native), and a replay or another worker saw something else."""
    t = type(value)
    if t is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if t is list:
        return [json_copy(v) for v in value]
    return value


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
