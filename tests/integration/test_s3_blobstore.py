"""S3BlobStore round trips over real HTTP against moto's standalone S3 server."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("minio", reason="needs the minio client (pip install 'wfe[s3]')")

from engine_port import ClaimCheck
from engine_port._blobs import BlobStore, is_spill_ref
from engine_port._blobstores import open_blob_store
from engine_port._s3 import S3BlobStore
from engine_port.errors import (
    ConfigurationError,
    DriverUnavailableError,
    EngineError,
    SpilledPayloadUnavailableError,
    UnsafeBlobKeyError,
)

# tests/ and tests/integration/ have no __init__.py, so pytest (default "prepend" import mode)
# imports this file as a top-level module with this folder on sys.path; the sibling helper is a
# top-level module too. If the folders become packages, the relative import takes over.
try:
    from .s3_server import free_port, s3_server  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from s3_server import free_port, s3_server

__all__ = ["s3_server"]  # the session fixture, re-exported so pytest finds it here

TRAVERSAL_KEYS = ["../escape", "a/../../b", "/abs/key", "a//b", "./a", "a\\b", ""]


# moto takes any credentials; the MinIO container of ``pytest --containers`` has its own
ACCESS_KEY = os.environ.get("WFE_TEST_S3_ACCESS_KEY", "test")
SECRET_KEY = os.environ.get("WFE_TEST_S3_SECRET_KEY", "test")


def s3_url(endpoint: str, bucket: str, path: str = "", **extra: str) -> str:
    query = f"endpoint={endpoint}&access_key={ACCESS_KEY}&secret_key={SECRET_KEY}"
    query += "".join(f"&{k}={v}" for k, v in extra.items())
    return f"s3://{bucket}{'/' + path if path else ''}?{query}"


def fresh_bucket() -> str:
    return f"wfe-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(s3_server: str) -> BlobStore:
    return open_blob_store(s3_url(s3_server, fresh_bucket()))


async def test_open_blob_store_builds_an_s3_store(s3_server: str) -> None:
    store = open_blob_store(s3_url(s3_server, "my-bucket", "tenant/a"))
    assert isinstance(store, S3BlobStore)
    assert store.bucket == "my-bucket"
    assert store.endpoint == s3_server
    assert store.prefix == "tenant/a"
    assert store.secure is False


async def test_put_get_has_delete_list(store: BlobStore) -> None:
    assert await store.list() == []  # creates the bucket on first use
    assert not await store.has("runs/r1/a")

    await store.put("runs/r1/b", b"bee")
    await store.put("runs/r1/a", b"ay")
    await store.put("runs/r2/a", b"\x00\xffbinary")
    await store.put("other", b"")

    assert await store.get("runs/r1/a") == b"ay"
    assert await store.get("runs/r2/a") == b"\x00\xffbinary"
    assert await store.get("other") == b""
    assert await store.has("runs/r1/b")

    await store.put("runs/r1/a", b"overwritten")
    assert await store.get("runs/r1/a") == b"overwritten"

    assert await store.list() == ["other", "runs/r1/a", "runs/r1/b", "runs/r2/a"]
    assert await store.list("runs/r1/") == ["runs/r1/a", "runs/r1/b"]
    assert await store.list("runs/") == ["runs/r1/a", "runs/r1/b", "runs/r2/a"]
    assert await store.list("nothing/") == []

    await store.delete("runs/r1/a")
    await store.delete("runs/r1/a")  # deleting a missing key is a no-op
    assert not await store.has("runs/r1/a")
    assert await store.list("runs/r1/") == ["runs/r1/b"]


async def test_store_prefix_is_prepended_and_hidden(s3_server: str) -> None:
    bucket = fresh_bucket()
    tenant_a = open_blob_store(s3_url(s3_server, bucket, "tenant-a"))
    tenant_b = open_blob_store(s3_url(s3_server, bucket, "tenant-b/nested"))
    whole = open_blob_store(s3_url(s3_server, bucket))

    await tenant_a.put("runs/r1/out", b"A")
    await tenant_b.put("runs/r1/out", b"B")

    assert await tenant_a.get("runs/r1/out") == b"A"
    assert await tenant_b.get("runs/r1/out") == b"B"
    assert await tenant_a.list() == ["runs/r1/out"]
    assert await tenant_b.list("runs/") == ["runs/r1/out"]
    # The objects really live under "prefix/key" in the bucket.
    assert await whole.list() == ["tenant-a/runs/r1/out", "tenant-b/nested/runs/r1/out"]
    assert await whole.get("tenant-a/runs/r1/out") == b"A"

    await tenant_a.delete("runs/r1/out")
    assert await whole.list() == ["tenant-b/nested/runs/r1/out"]


async def test_ten_megabyte_round_trip(store: BlobStore) -> None:
    data = os.urandom(10 * 1024 * 1024)
    await store.put("big/blob", data)
    assert await store.has("big/blob")
    assert await store.get("big/blob") == data


async def test_missing_key_raises_spilled_payload_unavailable(store: BlobStore) -> None:
    with pytest.raises(SpilledPayloadUnavailableError) as info:
        await store.get("runs/nope/output")
    assert info.value.key == "runs/nope/output"


async def test_missing_bucket_on_get_is_created_then_reports_missing_key(s3_server: str) -> None:
    store = open_blob_store(s3_url(s3_server, fresh_bucket()))
    with pytest.raises(SpilledPayloadUnavailableError):
        await store.get("never/written")


async def test_two_stores_race_to_create_the_same_bucket(s3_server: str) -> None:
    bucket = fresh_bucket()
    stores = [open_blob_store(s3_url(s3_server, bucket)) for _ in range(4)]
    await asyncio.gather(*(s.put(f"k{i}", b"x") for i, s in enumerate(stores)))
    assert await stores[0].list() == ["k0", "k1", "k2", "k3"]


@pytest.mark.parametrize("key", TRAVERSAL_KEYS)
async def test_traversal_keys_are_rejected_before_any_request(key: str) -> None:
    # Nothing listens on this endpoint: a request would raise DriverUnavailableError instead.
    store = open_blob_store(s3_url(f"127.0.0.1:{free_port()}", "bucket"))
    with pytest.raises(UnsafeBlobKeyError):
        await store.put(key, b"x")
    with pytest.raises(UnsafeBlobKeyError):
        await store.get(key)
    with pytest.raises(UnsafeBlobKeyError):
        await store.has(key)
    with pytest.raises(UnsafeBlobKeyError):
        await store.delete(key)
    if key:
        with pytest.raises(UnsafeBlobKeyError):
            await store.list(key)


def test_invalid_bucket_name_is_a_clear_engine_error() -> None:
    with pytest.raises(EngineError, match="bucket name 'b' is invalid"):
        open_blob_store("s3://b?endpoint=127.0.0.1:1&anonymous=true")


def test_unsafe_store_prefix_is_rejected() -> None:
    with pytest.raises(UnsafeBlobKeyError):
        S3BlobStore(bucket="bucket", endpoint="127.0.0.1:1", prefix="a/../b")


async def test_claim_check_spills_to_s3_and_loads_back(store: BlobStore) -> None:
    claim = ClaimCheck(store, threshold=1024)

    small: Any = {"order_id": "456", "total": 99.9}
    assert await claim.dump(small, "runs/r1/small") == small
    assert not await store.has("runs/r1/small")

    large: Any = {"order_id": "456", "lines": [{"sku": f"sku-{i}", "qty": i} for i in range(5000)]}
    ref = await claim.dump(large, "runs/r1/stages/load/output")
    assert is_spill_ref(ref)
    assert ClaimCheck.key_of(ref) == "runs/r1/stages/load/output"
    assert await store.has("runs/r1/stages/load/output")
    assert await claim.load(ref, run_id="r1") == large

    # A fresh store on the same bucket resolves the reference too (another worker process).
    assert isinstance(store, S3BlobStore)
    other = S3BlobStore(
        bucket=store.bucket, endpoint=store.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY
    )
    assert await ClaimCheck(other).load(ref, run_id="r1") == large

    await store.delete("runs/r1/stages/load/output")
    with pytest.raises(SpilledPayloadUnavailableError):
        await claim.load(ref, run_id="r1")


async def test_unreachable_endpoint_raises_driver_unavailable_quickly() -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens here
    store = open_blob_store(s3_url(endpoint, "bucket"))
    started = time.monotonic()
    with pytest.raises(DriverUnavailableError) as info:
        await store.put("runs/r1/out", b"x")
    assert time.monotonic() - started < 5.0
    message = str(info.value)
    assert endpoint in message
    assert "check" in message
    assert isinstance(info.value.__cause__, Exception)


async def test_unreachable_endpoint_with_no_retries() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    fast = S3BlobStore(bucket="bucket", endpoint=endpoint, connect_timeout=0.5, max_retries=0)
    started = time.monotonic()
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: fast.get("k"),
        lambda: fast.has("k"),
        lambda: fast.delete("k"),
        fast.list,
    ]
    for call in calls:
        with pytest.raises(DriverUnavailableError, match=endpoint):
            await call()
    assert time.monotonic() - started < 5.0


async def test_wrong_credentials_are_driver_unavailable(s3_server: str) -> None:
    # moto accepts any credentials by default, so only check the message shape for auth codes.
    from minio.error import S3Error

    store = S3BlobStore(bucket="bucket", endpoint=s3_server)
    err = S3Error(None, "AccessDenied", "Access Denied.", None, None, None)  # type: ignore[arg-type]
    translated = store._unavailable(err)
    assert isinstance(translated, DriverUnavailableError)
    assert s3_server in str(translated)
    assert "access_key" in str(translated)


# -- engine level: both drivers spill to S3 over HTTP (issue 15) -----------------------------


def _big_workflow(wf_id: str) -> Any:
    from pydantic import BaseModel

    from engine_port import StageContext, Workflow

    class In(BaseModel):
        n: int

    wf = Workflow(wf_id, input=In)

    @wf.stage
    async def make(ctx: StageContext[In]) -> dict[str, str]:
        step = await ctx.step.run("blob", lambda: "s" * (100 * 1024))
        return {"big": "b" * (ctx.input.n * 1024), "step": step[:3]}

    @wf.stage(after=[make])
    async def size(ctx: StageContext[In]) -> int:
        return len(ctx.output_of(make)["big"])

    return wf


async def _run_on(settings: Any, wf: Any) -> tuple[Any, list[str]]:
    from engine_port import EngineSettings, Registry, create_engine

    assert isinstance(settings, EngineSettings)
    async with create_engine(settings, Registry([wf])) as engine, engine.worker():
        run = await engine.start(wf.id, {"n": 200})
        info = await engine.wait(run.id, timeout=60)
    keys = await open_blob_store(settings.blob_url).list(f"runs/{run.id}/")
    return info, keys


async def test_native_engine_spills_to_s3(s3_server: str, tmp_path: Any) -> None:
    from engine_port import EngineSettings

    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
        blob_url=s3_url(s3_server, fresh_bucket(), "tenant"),
    )
    info, keys = await _run_on(settings, _big_workflow("s3-native"))
    assert info.status == "completed" and info.output == 200 * 1024
    assert info.stage("make").output["big"] == "b" * (200 * 1024)
    assert any("/steps/" in k for k in keys) and any("/stages/" in k for k in keys), keys


@pytest.mark.temporal
async def test_temporal_engine_spills_to_s3(s3_server: str, temporal_server: Any) -> None:
    from engine_port import EngineSettings

    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_server.address,
        task_queue=f"s3-{uuid.uuid4().hex[:8]}",
        blob_url=s3_url(s3_server, fresh_bucket()),
    )
    info, keys = await _run_on(settings, _big_workflow("s3-temporal"))
    assert info.status == "completed" and info.output == 200 * 1024
    assert info.stage("make").output["big"] == "b" * (200 * 1024)
    assert len(keys) >= 2, keys  # the step result and the stage output, under the run's prefix


async def test_a_server_that_never_answers_is_a_storage_fault_within_the_url_timeout() -> None:
    """An S3 endpoint that accepts connections but never answers (a hung proxy, an
    overloaded server) held a worker's attempt for ~8 minutes (a 120 s read timeout, tried
    4 times) before it became a storage fault; ``timeout=`` in blob_url bounds each try."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepted by the kernel, never read nor answered
    endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        store = open_blob_store(s3_url(endpoint, "bucket", timeout="0.5"))
        started = time.monotonic()
        with pytest.raises(DriverUnavailableError, match=endpoint):
            await asyncio.wait_for(store.get("runs/r1/out"), 60)
        assert time.monotonic() - started < 30
    finally:
        listener.close()


@pytest.mark.parametrize("bad", ["0", "-1", "soon", "inf", "nan"])
def test_a_timeout_that_is_not_a_positive_number_is_a_configuration_error(bad: str) -> None:
    with pytest.raises(EngineError, match="positive number of seconds"):
        open_blob_store(s3_url("127.0.0.1:9", "bucket", timeout=bad))


def test_an_endpoint_written_as_a_url_is_taken_as_aws_sdks_take_it() -> None:
    """``endpoint=http://host:9000`` (as AWS SDKs and MinIO's docs write it) raised minio's
    "ValueError: path in endpoint is not allowed" ("unexpected ValueError ... this is a bug"
    in the CLI)."""
    plain = open_blob_store(s3_url("http://127.0.0.1:9000", "bucket"))
    assert isinstance(plain, S3BlobStore) and not plain.secure
    assert plain.endpoint == "127.0.0.1:9000"
    tls = open_blob_store(s3_url("https://s3.example.com/", "bucket"))
    assert isinstance(tls, S3BlobStore) and tls.secure and tls.endpoint == "s3.example.com"
    for bad, says in (
        ("ftp://host:21", "endpoint scheme"),
        ("host:9000/some/path", "no path"),
    ):
        with pytest.raises(EngineError, match=says):
            open_blob_store(s3_url(bad, "bucket"))
    with pytest.raises(EngineError, match="drop secure="):
        open_blob_store(s3_url("http://127.0.0.1:9000", "bucket", secure="true"))


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("s3://b1?endpoint=127.0.0.1:9", "bucket name 'b1' is invalid"),
        ("s3://a..b?endpoint=127.0.0.1:9", "bucket name 'a..b' is invalid"),
        ("s3://bucket?endpoint=127.0.0.1:9&acces_key=k", "unknown parameter(s) acces_key"),
    ],
)
def test_a_bad_bucket_name_or_parameter_is_a_configuration_error(url: str, says: str) -> None:
    """``wfe`` exits 6 (bad configuration) on them: an invalid bucket name was a plain
    EngineError (exit 1), and a misspelt parameter was silently ignored."""
    with pytest.raises(ConfigurationError) as info:
        open_blob_store(url)
    assert says in str(info.value), info.value
