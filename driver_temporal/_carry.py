"""Payloads that show the business value and carry the engine's bookkeeping out of sight.

An operator reading a run in the Web UI or with ``temporal workflow show`` sees each payload's
data: the run's input, a stage's input and output, a failure's details. What the driver needs
beside them (the run id, attempt, step ledger, signals lent, events staged, ...) rides in the
same payload's metadata under the ``wfe`` key, as a JSON document: Temporal keeps metadata with
the payload (through any codec) and the UI does not render it. A payload without the key was
written by an older driver (its data is the whole document): both shapes are read.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.converter import PayloadConverter

__all__ = ["INFO_MAX", "META_KEY", "carried_failure", "carry", "carry_info", "meta_of"]

META_KEY = "wfe"
# the largest RunInfo a run's result repeats in its metadata (``carry_info``), in bytes of JSON
INFO_MAX = 8192


def carry(value: Any, meta: dict[str, Any], converter: PayloadConverter) -> RawValue:
    """``value`` as a payload (what the UI shows) with ``meta`` in its metadata."""
    payload = converter.to_payload(value)
    payload.metadata[META_KEY] = pydantic_core.to_json(meta)
    return RawValue(payload)


def carry_info(value: Any, info: dict[str, Any], converter: PayloadConverter) -> RawValue | None:
    """A run's result: its output (what the UI shows) with its final ``wfe_run`` memo
    (``info``) in the metadata, or None when that memo is over ``INFO_MAX`` bytes (a run of
    many stages: the describe reads it from the memo instead of growing the history)."""
    meta = pydantic_core.to_json({"run": info})
    if len(meta) > INFO_MAX:
        return None
    payload = converter.to_payload(value)
    payload.metadata[META_KEY] = meta
    return RawValue(payload)


def meta_of(payload: Payload) -> dict[str, Any] | None:
    """The engine metadata a payload carries, or None (a payload in the old shape)."""
    raw = payload.metadata.get(META_KEY)
    if raw is None:
        return None
    meta = pydantic_core.from_json(raw)
    return meta if isinstance(meta, dict) else None


def carried_failure(error: BaseException) -> dict[str, Any] | None:
    """The metadata a failed stage activity carried on its first failure detail (the
    ``ApplicationError`` the activity raised, as the workflow received it)."""
    failure = getattr(error, "failure", None)
    if failure is None or not failure.HasField("application_failure_info"):
        return None
    payloads = failure.application_failure_info.details.payloads
    if not payloads:
        return None
    return meta_of(payloads[0])
