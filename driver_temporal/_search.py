"""The custom search attributes the driver sets on every run, and the check made on connect."""

from __future__ import annotations

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey

from engine_port.errors import DriverUnavailableError

__all__ = [
    "SA_IDEMPOTENCY_KEY",
    "SA_STAGE",
    "SA_STATUS",
    "SA_VERSION",
    "SEARCH_ATTRIBUTES",
    "check_search_attributes",
]

SA_VERSION = SearchAttributeKey.for_keyword("WfeVersion")
SA_STATUS = SearchAttributeKey.for_keyword("WfeStatus")
SA_STAGE = SearchAttributeKey.for_keyword("WfeStage")
SA_IDEMPOTENCY_KEY = SearchAttributeKey.for_keyword("WfeIdempotencyKey")

SEARCH_ATTRIBUTES = ("WfeVersion", "WfeStatus", "WfeStage", "WfeIdempotencyKey")


async def check_search_attributes(client: Client, namespace: str, address: str) -> None:
    """Raise DriverUnavailableError naming the first missing attribute and the command that
    registers it."""
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = [n for n in SEARCH_ATTRIBUTES if n not in resp.custom_attributes]
    if missing:
        cmds = "; ".join(
            f"temporal operator search-attribute create --name {n} --type Keyword "
            f"--address {address} --namespace {namespace}"
            for n in missing
        )
        raise DriverUnavailableError(
            f"the Temporal namespace {namespace!r} at {address} has no search attribute "
            f"{missing[0]!r} (missing: {', '.join(missing)}); register it with: {cmds} "
            "(the dev server started by driver_temporal.TemporalDevServer registers them itself)"
        )
