"""Claim-check primitives shared by both drivers: the BlobStore port, a folder store, and the
spill reference format."""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from ._serde import JSON, dumps, loads
from .errors import SpilledPayloadUnavailableError, UnsafeBlobKeyError

__all__ = [
    "DEFAULT_SPILL_THRESHOLD",
    "SPILL_MARKER",
    "BlobStore",
    "ClaimCheck",
    "FolderBlobStore",
    "MemoryBlobStore",
    "check_key",
    "is_spill_ref",
]

DEFAULT_SPILL_THRESHOLD = 64 * 1024
SPILL_MARKER = "$wfe_spill"
_TMP_SUFFIX = ".wfe-tmp"


def check_key(key: str) -> str:
    """Reject keys that could escape a store's root (absolute paths, '..', backslashes)."""
    if not isinstance(key, str) or not key or "\x00" in key or "\\" in key:
        raise UnsafeBlobKeyError(str(key))
    path = PurePosixPath(key)
    if path.is_absolute() or any(part in ("..", ".", "") for part in key.split("/")):
        raise UnsafeBlobKeyError(key)
    return key


class BlobStore(Protocol):
    async def put(self, key: str, data: bytes) -> None: ...

    async def get(self, key: str) -> bytes:
        """Return the blob; raise SpilledPayloadUnavailableError when it is missing."""
        ...

    async def has(self, key: str) -> bool: ...

    async def delete(self, key: str) -> None: ...

    async def list(self, prefix: str = "") -> list[str]: ...


class FolderBlobStore:
    """Blobs as files under one folder (the embedded default)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def _path(self, key: str) -> Path:
        check_key(key)
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise UnsafeBlobKeyError(key)
        return path

    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # unique per write: two concurrent puts of one key must not share a temp file
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{_TMP_SUFFIX}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def _get(self, path: Path, key: str) -> bytes:
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise SpilledPayloadUnavailableError(key) from None

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, data)

    async def get(self, key: str) -> bytes:
        return await asyncio.to_thread(self._get, self._path(key), key)

    async def has(self, key: str) -> bool:
        return self._path(key).is_file()

    async def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    async def list(self, prefix: str = "") -> list[str]:
        if prefix:
            check_key(prefix.rstrip("/"))
        if not self.root.exists():
            return []
        keys = []
        for p in self.root.rglob("*"):
            if p.is_file() and not (p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX)):
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)


class MemoryBlobStore:
    """Blobs in a dict (tests)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    async def put(self, key: str, data: bytes) -> None:
        self.blobs[check_key(key)] = data

    async def get(self, key: str) -> bytes:
        try:
            return self.blobs[check_key(key)]
        except KeyError:
            raise SpilledPayloadUnavailableError(key) from None

    async def has(self, key: str) -> bool:
        return check_key(key) in self.blobs

    async def delete(self, key: str) -> None:
        self.blobs.pop(check_key(key), None)

    async def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.blobs if k.startswith(prefix))


def is_spill_ref(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and SPILL_MARKER in value


class ClaimCheck:
    """Stores values over a threshold in a BlobStore behind a reference, and resolves them.

    A reference is ``{"$wfe_spill": {"key": ..., "size": ..., "sha256": ...}}``.
    """

    def __init__(self, store: BlobStore, threshold: int = DEFAULT_SPILL_THRESHOLD) -> None:
        self.store = store
        self.threshold = threshold

    async def dump(self, value: JSON, key: str, *, force: bool = False) -> JSON:
        """Return ``value`` itself, or a spill reference when it is large (or ``force``)."""
        data = dumps(value)
        if not force and len(data) <= self.threshold:
            return value
        await self.store.put(key, data)
        return {
            SPILL_MARKER: {
                "key": key,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        }

    async def load(self, value: JSON) -> JSON:
        """Resolve a spill reference (values that are not references pass through)."""
        if not is_spill_ref(value):
            return value
        ref = value[SPILL_MARKER]
        data = await self.store.get(ref["key"])
        return loads(data)

    @staticmethod
    def key_of(value: JSON) -> str | None:
        return value[SPILL_MARKER]["key"] if is_spill_ref(value) else None
