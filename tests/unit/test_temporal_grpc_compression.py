"""``EngineSettings.temporal_grpc_compression``: the Temporal driver's connection sends
uncompressed to a loopback address ("auto"), where temporalio's default gzip costs CPU on both
ends and saves no bandwidth, and gzip to any other address."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.service import GrpcCompression

from driver_temporal._rpc import grpc_compression
from engine_port import EngineSettings


@pytest.mark.parametrize("address", ["127.0.0.1:7233", "localhost:7233", "[::1]:7233", "127.8.0.1"])
def test_auto_sends_uncompressed_to_a_loopback_address(address: str) -> None:
    assert grpc_compression("auto", address) is GrpcCompression.NONE


@pytest.mark.parametrize(
    "address", ["ns.acct.tmprl.cloud:7233", "10.0.0.5:7233", "temporal:7233", "[2001:db8::1]:7233"]
)
def test_auto_compresses_to_any_other_address(address: str) -> None:
    assert grpc_compression("auto", address) is GrpcCompression.GZIP


def test_an_explicit_choice_wins() -> None:
    assert grpc_compression("gzip", "127.0.0.1:7233") is GrpcCompression.GZIP
    assert grpc_compression("none", "ns.acct.tmprl.cloud:7233") is GrpcCompression.NONE


def test_the_setting_takes_only_the_three_choices() -> None:
    assert EngineSettings().temporal_grpc_compression == "auto"
    with pytest.raises(ValidationError, match="temporal_grpc_compression"):
        EngineSettings(temporal_grpc_compression="brotli")  # type: ignore[arg-type]
