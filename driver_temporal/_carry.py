"""Payloads that show the business value and carry the engine's bookkeeping out of sight.

An operator reading a run in the Web UI or with ``temporal workflow show`` sees each payload's
data: the run's input, a stage's input and output, a failure's details. What the driver needs
beside them (the run id, attempt, step ledger, signals lent, events staged, ...) rides in the
same payload's metadata under the ``wfe`` key, as a JSON document: Temporal keeps metadata with
the payload (through any codec) and the UI does not render it. A payload without the key was
written by an older driver (its data is the whole document): both shapes are read.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    PayloadConverter,
)

__all__ = [
    "DATA_CONVERTER",
    "INFO_MAX",
    "META_KEY",
    "carried_failure",
    "carry",
    "carry_info",
    "compact",
    "meta_of",
    "whole",
]

META_KEY = "wfe"
# the largest RunInfo a run's result repeats in its metadata (``carry_info``), in bytes of JSON
INFO_MAX = 8192


class _InOrderJSON(JSONPlainPayloadConverter):
    """Temporal's ``json/plain`` converter, keeping the keys of an object in the order the
    user gave them, as the native driver stores them (Temporal's own sorts them: a stage
    that returned ``{"b": 1, "a": 2}`` gave ``{"a": 2, "b": 1}`` on this driver only, and a
    run's input and signal payloads too). Reads are the same (any key order)."""

    def to_payload(self, value: Any) -> Payload | None:
        return Payload(
            metadata={"encoding": self.encoding.encode()},
            data=json.dumps(value, cls=self._encoder, separators=(",", ":")).encode(),
        )


class _PayloadConverter(CompositePayloadConverter):
    def __init__(self) -> None:
        super().__init__(
            *(
                _InOrderJSON() if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


DATA_CONVERTER = DataConverter(payload_converter_class=_PayloadConverter)
"""The data converter of every client (and so every worker and replayer) of the driver."""


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


# what every event of a run repeats: a batch of events a stage activity carries leaves it out
# (``compact``, the workflow), the activity puts it back from its task (``whole``) before it
# delivers or parks the batch
_REPEATED = ("run_id", "workflow_id")
_DEFAULTS: dict[str, Any] = {"stage": None, "business": False}


def compact(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` as a carried batch holds it: without the run and workflow ids and the fields
    at their defaults. A run whose events no sink confirms carries them again in each stage
    activity's input (up to ``_outbox.LAZY_MAX``), each copy in the history: those are ~40%
    of its bytes."""
    return {
        k: v
        for k, v in event.items()
        if k not in _REPEATED and not (k in _DEFAULTS and v is _DEFAULTS[k])
    }


def whole(events: list[dict[str, Any]], run_id: str, workflow_id: str) -> list[dict[str, Any]]:
    """Carried ``events`` of run ``run_id`` as they were emitted (a batch an older driver
    carried is whole already)."""
    return [{"run_id": run_id, "workflow_id": workflow_id, **_DEFAULTS, **e} for e in events]
