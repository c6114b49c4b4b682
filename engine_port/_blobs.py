"""Claim-check primitives shared by both drivers: the BlobStore port, a folder store, and the
spill reference format."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ._serde import JSON, dumps, loads
from .errors import DriverUnavailableError, SpilledPayloadUnavailableError, UnsafeBlobKeyError

__all__ = [
    "DEFAULT_SPILL_THRESHOLD",
    "INLINE_MARKER",
    "OFF_LOOP_BYTES",
    "SPILL_MARKER",
    "BlobStore",
    "ClaimCheck",
    "FolderBlobStore",
    "MemoryBlobStore",
    "box_inline",
    "check_key",
    "is_disk_full",
    "is_spill_ref",
    "run_prefix",
]

DEFAULT_SPILL_THRESHOLD = 64 * 1024
SPILL_MARKER = "$wfe_spill"
# wraps an inline user value that has the shape of engine metadata, so it is never taken for it
INLINE_MARKER = "$wfe_inline"
_TMP_SUFFIX = ".wfe-tmp"
OFF_LOOP_BYTES = 1024 * 1024
"""A spilled value's JSON of at least this many bytes is hashed (``dump``) and decoded
(``load``) on a worker thread, not on the event loop: at 10 MB that is ~25 ms of CPU on a
quiet host and several hundred ms beside CPU hogs, during which no heartbeat of the worker's
leases got through (on a slower or busier host, or a larger value, longer than the lease: the
job was taken over and its steps ran again). Below it the hop costs more than the work."""
# what a write to a full filesystem raises: no space left, or the user's disk quota used up
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is an OS error that says the filesystem is full (ENOSPC, EDQUOT)."""
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL


def check_key(key: str) -> str:
    """Reject keys that could escape a store's root (absolute paths, '..', backslashes)."""
    if not isinstance(key, str) or not key or "\x00" in key or "\\" in key:
        raise UnsafeBlobKeyError(str(key))
    # (an absolute POSIX path starts with "/": ``PurePosixPath.is_absolute`` in a tenth of
    # the time, on every blob read and write)
    if key.startswith("/") or any(part in ("..", ".", "") for part in key.split("/")):
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
        self._base = str(self.root).rstrip("/")  # (the root "/": "", each part adds "/...")

    def _path(self, key: str) -> Path:
        check_key(key)
        if self._no_link_in(key):
            # the resolved root, then parts that are no symlink nor "..": resolved already
            return self.root / key
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise UnsafeBlobKeyError(key)
        return path

    def _no_link_in(self, key: str) -> bool:
        """Whether no part of ``key`` (a checked key) is a symlink under the root, up to the
        first part that does not exist: then the key's path is its own resolved path, and
        ``_path`` need not resolve it (``Path.resolve`` was ~40 us of a ~100 us ``put_now``:
        it looks at every part of the root too, in Python). A symlink found (or a part that
        cannot be looked at): False, and ``_path`` resolves as before."""
        at = self._base
        for part in key.split("/"):
            at = f"{at}/{part}"
            try:
                mode = os.lstat(at).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return True  # nothing below it exists: nothing to follow
            except OSError:
                return False
            if stat.S_ISLNK(mode):
                return False
        return True

    def put_now(self, key: str, data: bytes) -> None:
        """``put`` on the calling thread (no hop to a worker thread): for small blobs written
        from the event loop, where the hop costs more than the write (a temp file and a
        rename of a few KiB; no fsync either way)."""
        path = self._path(key)
        # unique per write: two concurrent puts of one key must not share a temp file
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{_TMP_SUFFIX}")
        created: list[Path] = []  # the folders this write made: removed again if it fails
        written = False
        try:
            # a write that fails midway (a full disk) leaves no blob under the key: only the
            # rename of a complete temp file makes one
            for again in (True, False):
                try:
                    self._make_folders(path.parent, created)
                    tmp.write_bytes(data)
                    break
                except FileNotFoundError:
                    # a folder on its way was removed meanwhile, found empty by a failed
                    # write or a delete of another key in it (below): make it again, once
                    if not again:
                        raise
            os.replace(tmp, path)
            written = True
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DriverUnavailableError(
                f"the blob store folder {str(self.root)!r} is on a full disk ({exc.strerror}; "
                f"writing a blob of {len(data)} bytes): free disk space there, or move "
                "blob_url to a larger disk, then retry; runs waiting to write continue by "
                "themselves once there is room"
            ) from None
        finally:
            if not written:
                tmp.unlink(missing_ok=True)  # (renamed when written: nothing left to remove)
                # a failed write leaves no empty runs/<id>/ behind (a start that could not
                # spill its input made no run); a folder another write put a blob in stays
                for folder in reversed(created):
                    with contextlib.suppress(OSError):  # not empty: it stays
                        folder.rmdir()

    def _make_folders(self, folder: Path, created: list[Path]) -> None:
        """``mkdir -p folder``, appending each folder it made (outermost first) to
        ``created``; one a concurrent write made first is not this write's."""
        missing: list[Path] = []
        while folder != self.root and not folder.is_dir():
            missing.append(folder)
            folder = folder.parent
        if folder == self.root:
            self.root.mkdir(parents=True, exist_ok=True)  # the store's own folder: it stays
        for each in reversed(missing):
            try:
                each.mkdir()
            except FileExistsError:
                continue
            created.append(each)

    def _get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise SpilledPayloadUnavailableError(key) from None

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.put_now, key, data)

    async def get(self, key: str) -> bytes:
        # (the key's checks too, a stat per part of it: on the thread that reads the file)
        return await asyncio.to_thread(self._get, key)

    async def has(self, key: str) -> bool:
        return self._path(key).is_file()

    async def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # the folders it leaves empty go too (a spilled input dropped by an idempotent repeat
        # of a start leaves no empty runs/<id>/); the store's own folder stays
        folder = path.parent
        while folder != self.root:
            try:
                folder.rmdir()
            except OSError:
                break  # not empty: nor are its parents
            folder = folder.parent

    async def list(self, prefix: str = "") -> list[str]:
        if prefix:
            check_key(prefix.rstrip("/"))
        # walk only the folder the prefix names (a run's blobs, not the whole store)
        folder = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        if not folder.is_dir():
            return []
        keys = []
        # os.walk, not Path.rglob: a folder removed while it walks (a purge elsewhere) is
        # skipped, where rglob raised FileNotFoundError
        for parent, _, names in os.walk(folder):
            for name in names:
                if name.startswith(".") and name.endswith(_TMP_SUFFIX):
                    continue
                key = Path(parent, name).relative_to(self.root).as_posix()
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


def _is_boxed(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and INLINE_MARKER in value


def box_inline(value: JSON) -> JSON:
    """The stored form of an inline user value. A value shaped like engine metadata (a spill
    reference or a box) is wrapped in a box, so that no user JSON is ever read as a
    reference (DESIGN §5, claim check); every other value is stored as it is."""
    if is_spill_ref(value) or _is_boxed(value):
        return {INLINE_MARKER: value}
    return value


def _digest(data: bytes) -> str:
    """The sha256 of a spilled value's JSON, as its reference records it."""
    return hashlib.sha256(data).hexdigest()


def run_prefix(run_id: str) -> str:
    """Every blob of a run lives under this prefix; a run reads no blob outside it."""
    return f"runs/{run_id}/"


class ClaimCheck:
    """Stores values over a threshold in a BlobStore behind a reference, and resolves them.

    A stored value is the user's value itself, a box ``{"$wfe_inline": value}`` when the
    value has the shape of engine metadata, or a reference
    ``{"$wfe_spill": {"key": ..., "size": ..., "sha256": ...}}`` whose key lies under the
    run's own prefix. Only :meth:`dump` makes stored values; only :meth:`load` reads them.
    """

    def __init__(self, store: BlobStore, threshold: int = DEFAULT_SPILL_THRESHOLD) -> None:
        self.store = store
        self.threshold = threshold

    async def dump(self, value: JSON, key: str | Callable[[], str], *, force: bool = False) -> JSON:
        """Return the stored form of ``value``: itself (boxed if needed), or a spill
        reference when it is large (or ``force``), stored under ``key`` (or the key that
        ``key()`` makes: called only then, so an inline value costs no fresh key)."""
        data = dumps(value)
        if not force and len(data) <= self.threshold:
            return box_inline(value)
        if not isinstance(key, str):
            key = key()
        await self.store.put(key, data)
        if len(data) < OFF_LOOP_BYTES:
            return self.reference(key, data)
        return await asyncio.to_thread(self.reference, key, data)

    @staticmethod
    def reference(key: str, data: bytes) -> JSON:
        """The reference to ``data`` (a value's JSON) stored under ``key``: what :meth:`dump`
        returns for a large value, for a caller that stored it itself."""
        return {SPILL_MARKER: {"key": key, "size": len(data), "sha256": _digest(data)}}

    async def load(self, value: JSON, *, run_id: str) -> JSON:
        """The user value behind a stored value of run ``run_id``: a reference is read
        from the store (only under the run's own prefix), a box is opened, anything else
        passes through."""
        if _is_boxed(value):
            return value[INLINE_MARKER]
        if not is_spill_ref(value):
            return value
        key = self.key_of(value)
        if key is None or not key.startswith(run_prefix(run_id)):
            raise SpilledPayloadUnavailableError(
                str(key),
                f"it is not a well-formed reference under run {run_id!r}'s own prefix "
                f"{run_prefix(run_id)!r}",
            )
        data = await self.store.get(key)
        if len(data) < OFF_LOOP_BYTES:
            return loads(data)
        return await asyncio.to_thread(loads, data)

    @staticmethod
    def key_of(value: JSON) -> str | None:
        """The blob key of a stored value, or None when it is stored inline."""
        if not is_spill_ref(value):
            return None
        ref = value[SPILL_MARKER]
        key = ref.get("key") if isinstance(ref, dict) else None
        return key if isinstance(key, str) else None
