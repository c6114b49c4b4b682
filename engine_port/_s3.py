"""A BlobStore on S3 or MinIO, through the official ``minio`` client (the ``wfe[s3]`` extra).

The minio client is synchronous; every call runs in a worker thread (``asyncio.to_thread``) so
the event loop never blocks on the network. Driver failures never cross the port: a missing
object is :class:`SpilledPayloadUnavailableError`, anything else that goes wrong talking to the
server is :class:`DriverUnavailableError` with a message naming the endpoint.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import certifi
import urllib3
from minio import Minio
from minio.error import MinioException, S3Error, ServerError
from minio.helpers import check_bucket_name
from urllib3.util import Retry, Timeout

from ._blobs import check_key
from .errors import DriverUnavailableError, EngineError, SpilledPayloadUnavailableError

__all__ = ["S3BlobStore"]

T = TypeVar("T")

# S3 error codes that mean "the object (or its bucket) is not there".
_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject", "NoSuchBucket", "ResourceNotFound"})
# S3 error codes that mean the credentials are wrong.
_AUTH_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}
)
# Failures worth another try of the same request: the network, or the server's 5xx.
_TRANSIENT = (urllib3.exceptions.HTTPError, ServerError, OSError)


def _describe(exc: BaseException, timeout: Timeout) -> str:
    """One short line saying what went wrong talking to the server, without urllib3's
    ``HTTPConnectionPool(...)``/``Max retries exceeded`` wrapping."""
    err = exc
    while isinstance(err, urllib3.exceptions.MaxRetryError) and err.reason is not None:
        err = err.reason
    if isinstance(err, urllib3.exceptions.NewConnectionError):
        cause = err.__cause__ or err.__context__
        if isinstance(cause, ConnectionRefusedError):
            return "cannot connect (connection refused)"
        reason = getattr(cause, "strerror", None) or type(cause).__name__
        return f"cannot connect ({reason})"
    if isinstance(err, urllib3.exceptions.ConnectTimeoutError):
        return f"cannot connect (no answer within {timeout.connect_timeout}s)"
    if isinstance(err, urllib3.exceptions.ReadTimeoutError):
        return f"no answer within {timeout.read_timeout}s"
    if isinstance(err, urllib3.exceptions.ProtocolError):
        return "the connection was lost mid-request"
    if isinstance(err, ServerError):
        return f"server error (HTTP {err.status_code})"
    if isinstance(err, ConnectionRefusedError):
        return "cannot connect (connection refused)"
    text = " ".join(str(err).split())
    if len(text) > 160:
        text = text[:160] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class S3BlobStore:
    """Blobs as objects ``[prefix/]key`` in one S3/MinIO bucket (created on first use).
    Without ``access_key`` and ``secret_key`` the requests are anonymous (a public bucket)."""

    def __init__(
        self,
        *,
        bucket: str,
        endpoint: str = "127.0.0.1:9000",
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        secure: bool = False,
        region: str | None = None,
        prefix: str = "",
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_retries: int = 3,
        retry_backoff: float = 0.2,
        http_client: urllib3.PoolManager | None = None,
    ) -> None:
        try:
            check_bucket_name(bucket)
        except ValueError as exc:
            raise EngineError(
                f"S3 bucket name {bucket!r} is invalid ({exc}); use 3-63 lowercase letters, "
                "digits, '.' or '-' in blob_url (s3://BUCKET?endpoint=HOST:PORT)"
            ) from None
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        self.bucket = bucket
        self.endpoint = endpoint
        self.secure = secure
        self.prefix = prefix
        self.max_retries = max(0, max_retries)
        self.retry_backoff = retry_backoff
        self._timeout = Timeout(connect=connect_timeout, read=read_timeout)
        if http_client is None:
            # minio's default waits 5 minutes to connect and retries 5 times; an unreachable
            # server must be reported promptly instead. The store retries a failed request
            # itself (``_run``): urllib3's own retries log a WARNING with a raw error per try
            # (three per blob call for as long as S3 is down).
            http_client = urllib3.PoolManager(
                timeout=self._timeout,
                maxsize=10,
                cert_reqs="CERT_REQUIRED",
                ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
                retries=Retry(total=0, redirect=0, raise_on_status=False),
            )
        self._client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            session_token=session_token,
            secure=secure,
            region=region,
            http_client=http_client,
        )
        self._bucket_ready = False
        self._bucket_lock = threading.Lock()

    def __repr__(self) -> str:
        scheme = "https" if self.secure else "http"
        where = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        return f"S3BlobStore({scheme}://{self.endpoint}/{where})"

    # -- helpers -----------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _unavailable(self, exc: BaseException) -> DriverUnavailableError:
        scheme = "https" if self.secure else "http"
        where = f"{scheme}://{self.endpoint} (bucket {self.bucket!r})"
        if isinstance(exc, S3Error):
            detail = f"{exc.code}: {exc.message}"
            if exc.code in _AUTH_CODES:
                hint = "check access_key and secret_key in blob_url, and the bucket's policy"
            else:
                hint = "check the bucket name, region and the server's logs"
        else:
            detail = _describe(exc, self._timeout)
            hint = (
                "check that the S3/MinIO server is running and reachable at that host:port, "
                "and that secure= matches it (false for http, true for https)"
            )
        return DriverUnavailableError(f"S3 blob store at {where} failed: {detail}; {hint}")

    def _ensure_bucket(self) -> None:
        if self._bucket_ready:
            return
        with self._bucket_lock:
            if self._bucket_ready:
                return
            if not self._client.bucket_exists(self.bucket):
                try:
                    self._client.make_bucket(self.bucket)
                except S3Error as exc:
                    # Another process created it between our check and our create.
                    if exc.code == "BucketAlreadyOwnedByYou":
                        pass
                    elif exc.code == "BucketAlreadyExists":
                        if not self._client.bucket_exists(self.bucket):
                            raise  # owned by someone else: we cannot use it
                    else:
                        raise
            self._bucket_ready = True

    async def _run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a thread after making sure the bucket exists; translate failures."""

        def call() -> T:
            tries = 0
            while True:
                try:
                    self._ensure_bucket()
                    return fn()
                except _TRANSIENT:
                    if tries >= self.max_retries:
                        raise
                    time.sleep(self.retry_backoff * 2**tries)
                    tries += 1

        try:
            return await asyncio.to_thread(call)
        except (SpilledPayloadUnavailableError, DriverUnavailableError):
            raise
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._unavailable(exc) from exc

    # -- BlobStore ---------------------------------------------------------------------------

    async def put(self, key: str, data: bytes) -> None:
        name = self._name(key)

        def put() -> None:
            try:
                self._client.put_object(self.bucket, name, io.BytesIO(data), length=len(data))
            except S3Error as exc:
                if exc.code != "NoSuchBucket":
                    raise
                # The bucket went away after we made sure of it (an S3 server restarted
                # without its data, a bucket deleted by hand): create it again, or every
                # write would fail until the process restarts.
                with self._bucket_lock:
                    self._bucket_ready = False
                self._ensure_bucket()
                self._client.put_object(self.bucket, name, io.BytesIO(data), length=len(data))

        await self._run(put)

    async def get(self, key: str) -> bytes:
        name = self._name(key)

        def get() -> bytes:
            try:
                response = self._client.get_object(self.bucket, name)
            except S3Error as exc:
                if exc.code in _MISSING_CODES:
                    raise SpilledPayloadUnavailableError(key) from None
                raise
            try:
                return bytes(response.read())
            finally:
                response.close()
                response.release_conn()

        return await self._run(get)

    async def has(self, key: str) -> bool:
        name = self._name(key)

        def has() -> bool:
            try:
                self._client.stat_object(self.bucket, name)
            except S3Error as exc:
                if exc.code in _MISSING_CODES:
                    return False
                raise
            return True

        return await self._run(has)

    async def delete(self, key: str) -> None:
        name = self._name(key)

        def delete() -> None:
            # S3 deletes are idempotent: a missing object is not an error.
            self._client.remove_object(self.bucket, name)

        await self._run(delete)

    async def list(self, prefix: str = "") -> list[str]:
        if prefix:
            check_key(prefix.rstrip("/"))
        root = f"{self.prefix}/" if self.prefix else ""

        def list_keys() -> list[str]:
            keys: list[str] = []
            for obj in self._client.list_objects(self.bucket, prefix=root + prefix, recursive=True):
                name = obj.object_name
                if name is None or not name.startswith(root) or obj.is_dir:
                    continue
                keys.append(name[len(root) :])
            return sorted(keys)

        return await self._run(list_keys)
