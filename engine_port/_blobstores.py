"""Open a BlobStore from a URL: ``file://<folder>``, ``memory://``, or
``s3://<bucket>?endpoint=<host:port>&access_key=..&secret_key=..&secure=false``."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from ._blobs import BlobStore, FolderBlobStore, MemoryBlobStore
from .errors import DriverUnavailableError, EngineError

__all__ = ["open_blob_store"]


def open_blob_store(url: str) -> BlobStore:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        path = (parsed.netloc + parsed.path) if parsed.netloc else parsed.path
        return FolderBlobStore(path or ".")
    if parsed.scheme == "memory":
        return MemoryBlobStore()
    if parsed.scheme == "s3":
        try:
            from ._s3 import S3BlobStore
        except ImportError:
            raise DriverUnavailableError(
                "s3:// blob storage needs the minio client; install it with: pip install 'wfe[s3]'"
            ) from None
        q = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
        if not parsed.netloc:
            raise EngineError(f"blob_url {url!r} names no bucket; use s3://BUCKET?endpoint=HOST")
        return S3BlobStore(
            bucket=parsed.netloc,
            endpoint=q.get("endpoint", "127.0.0.1:9000"),
            access_key=q.get("access_key", "minioadmin"),
            secret_key=q.get("secret_key", "minioadmin"),
            secure=q.get("secure", "false").lower() in ("1", "true", "yes"),
            region=q.get("region"),
            prefix=parsed.path.strip("/"),
        )
    raise EngineError(
        f"blob_url {url!r} has an unknown scheme; use file://FOLDER, memory:// or s3://BUCKET"
    )
