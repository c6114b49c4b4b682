"""Open a BlobStore from a URL: ``file://<folder>``, ``memory://``, or
``s3://<bucket>?endpoint=<host:port>&access_key=..&secret_key=..&secure=false``."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from ._blobs import BlobStore, FolderBlobStore, MemoryBlobStore, check_key
from .errors import DriverUnavailableError, EngineError, UnsafeBlobKeyError

__all__ = ["delete_prefixes", "open_blob_store"]


def _remove_folders(root: Path, prefixes: Sequence[str]) -> None:
    for prefix in prefixes:
        path = (root / prefix).resolve()
        if path == root or not path.is_relative_to(root):
            raise UnsafeBlobKeyError(prefix)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)


async def delete_prefixes(store: BlobStore, prefixes: Sequence[str]) -> None:
    """Delete every blob under each of ``prefixes`` (folder-like keys such as ``runs/<id>/``).

    Work is proportional to what is deleted, never to the store's size: a folder store removes
    each prefix's directory in one worker thread (the event loop never walks the tree); other
    stores list by prefix (S3 and the database filter server-side) and delete what they list.
    """
    for prefix in prefixes:
        check_key(prefix.rstrip("/"))
    if isinstance(store, FolderBlobStore):
        await asyncio.to_thread(_remove_folders, store.root, list(prefixes))
        return
    for prefix in prefixes:
        for key in await store.list(prefix):
            await store.delete(key)


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
