"""The step journal of one stage (or compensation) of one redrive of a run: every step record
the StageRunner journals, written durably before the stage body continues, so that a try that
replaces a lost one replays those steps instead of running them again.

Cost per step is constant and small. On a ``FolderBlobStore`` (the default) the journal is one
append-only JSON-lines file, ``<prefix>journal.jsonl``, opened once per try (``O_APPEND``) and
written with one ``os.write`` per step: no new file, no temp-file-and-rename, no thread hop. The
record is in the kernel's page cache when the step returns, so it survives the death of the
worker process (the guarantee the driver gives; like ``FolderBlobStore.put`` there is no fsync,
so a power loss of the machine is not covered). Records are self-delimiting lines; a line torn
by a crash mid-write is ignored on read (that step had not returned, so it runs again), and the
next try starts its first record on a new line. Other
BlobStores (S3, memory) cannot append: there each record is one ``put`` of its own key
(``<prefix><step>.json``), constant per step too. Reading lists only the journal's own folder
(never the whole store); the later record of a step wins. ``read_run_journals`` reads every
journal of a run (``TemporalEngine.steps``), listing only the run's own journal folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pydantic_core

from engine_port import BlobStore, FolderBlobStore

from ._wire import journal_key, journal_log_key, journal_run_prefix

__all__ = [
    "INLINE_PUT_MAX",
    "JournalKey",
    "StepJournal",
    "put_small",
    "read_run_journals",
    "step_records",
    "writes_now",
]

# the folders of a run's journals under ``journal_run_prefix``: ``<stage>/r<redrive>/<kind>/``
# (spilled step results live beside them, under ``<stage>/<hash>/``)
_KINDS = ("stage", "compensate")
_REDRIVE = re.compile(r"r([0-9]+)")
# (stage folder (``journal_stage_part``), redrive, kind) of one journal of a run
JournalKey = tuple[str, int, str]

# the largest blob ``put_small`` writes on the event loop (a folder store's temp file and rename
# of a few KiB take tens of microseconds; the thread hop ``FolderBlobStore.put`` makes costs
# ~1 ms on a busy worker, on the critical path of the activity or workflow task that waits)
INLINE_PUT_MAX = 64 * 1024


def writes_now(store: BlobStore, data: bytes) -> bool:
    """Whether ``put_small`` writes ``data`` on the calling thread (``put_now``): a
    ``FolderBlobStore`` whose ``put`` is its own (not a wrapper that counts or fails writes),
    and a blob up to ``INLINE_PUT_MAX`` bytes."""
    return (
        isinstance(store, FolderBlobStore)
        and type(store).put is FolderBlobStore.put
        and len(data) <= INLINE_PUT_MAX
    )


async def put_small(store: BlobStore, key: str, data: bytes) -> None:
    """``store.put``, but on a ``FolderBlobStore`` a blob up to ``INLINE_PUT_MAX`` bytes is
    written without a thread hop, as the step journal writes (same file and rename, same
    durability: no fsync). A subclass that overrides ``put`` (a wrapper that counts or fails
    writes) keeps its own."""
    if writes_now(store, data):
        assert isinstance(store, FolderBlobStore)
        store.put_now(key, data)
        return
    await store.put(key, data)


class StepJournal:
    """Append and read the step records under one journal prefix."""

    def __init__(self, store: BlobStore, prefix: str, *, case_safe: bool = False) -> None:
        self._store = store
        self._prefix = prefix
        self._case_safe = case_safe  # (its run's ``blob_keys``: ``journal_key``)
        self._dir: str | None = None
        if isinstance(store, FolderBlobStore):
            # journal_prefix() builds only safe parts (a str path: a ``Path`` join was a
            # tenth of a no-op stage activity's own CPU)
            self._dir = os.path.join(store.root, prefix)
        self._fd: int | None = None

    async def append(self, record: dict[str, Any]) -> None:
        line = pydantic_core.to_json(record) + b"\n"
        if self._dir is None:
            await self._store.put(journal_key(self._prefix, record["name"], self._case_safe), line)
            return
        if self._fd is None:
            os.makedirs(self._dir, exist_ok=True)
            self._fd = os.open(
                os.path.join(self._dir, journal_log_key("")),
                os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                0o644,
            )
            if os.fstat(self._fd).st_size:
                line = b"\n" + line  # end a line a crashed try may have torn
        view = memoryview(line)
        while view:  # a regular file takes it in one write; loop for the pathological case
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    async def read(self) -> list[dict[str, Any]]:
        """Every record journaled under the prefix, oldest first."""
        blobs: list[bytes] = []
        if self._dir is not None:
            # (no folder, the common case of a first try: no thread hop to find that out)
            if os.path.isdir(self._dir):  # noqa: ASYNC240 (a stat: cheaper than the hop)
                blobs = await asyncio.to_thread(self._read_dir, self._dir)
        else:
            for key in await self._store.list(self._prefix):
                blobs.append(await self._store.get(key))
        return _records(blobs)

    @staticmethod
    def _read_dir(folder: str) -> list[bytes]:
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
        blobs = []
        for name in _in_order(names):
            with contextlib.suppress(FileNotFoundError):
                blobs.append(Path(folder, name).read_bytes())
        return blobs


def _in_order(names: Iterable[str]) -> list[str]:
    """The blobs of one journal folder in the order they are read: one-file-per-step records
    (older driver versions, and stores that cannot append) first, then the log in write
    order."""
    log = journal_log_key("")
    files = sorted(n for n in names if n.endswith(".json") and not n.startswith("."))
    if log in names:
        files.append(log)
    return files


def _records(blobs: Iterable[bytes]) -> list[dict[str, Any]]:
    """The records in a journal's blobs, oldest first."""
    out: list[dict[str, Any]] = []
    for blob in blobs:
        for line in blob.splitlines():
            if not line.strip():
                continue
            try:
                rec = pydantic_core.from_json(line)
            except ValueError:
                continue  # torn by a crash mid-write: that step never returned
            if isinstance(rec, dict) and "name" in rec:
                out.append(rec)
    return out


def step_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps among a journal's ``records``: without the result documents of local tries
    (kind ``outcome``, ``_activities._Recorded``) and without the mark of a signal taken from
    the run (``via``: it only guides a retried try)."""
    return [
        {k: v for k, v in r.items() if k != "via"} for r in records if r.get("kind") != "outcome"
    ]


async def read_run_journals(
    store: BlobStore, run_id: str
) -> dict[JournalKey, list[dict[str, Any]]]:
    """Every step journal of run ``run_id`` (each stage's and compensation's, of each redrive),
    its records oldest first (as ``StepJournal.read`` reads one). Only the run's own journal
    folder is listed, never the whole store; spilled step results beside the journals are
    not read."""
    prefix = journal_run_prefix(run_id)
    if isinstance(store, FolderBlobStore):
        root = os.path.join(store.root, prefix)
        if not os.path.isdir(root):  # noqa: ASYNC240 (a stat: cheaper than the hop)
            return {}
        found = await asyncio.to_thread(_read_run_dir, root)
        return {where: _records(blobs) for where, blobs in found.items()}
    names: dict[JournalKey, list[str]] = {}
    for key in await store.list(prefix):
        parts = key[len(prefix) :].split("/")
        where = _journal_of(parts[:-1])
        if where is not None:
            names.setdefault(where, []).append(parts[-1])
    out: dict[JournalKey, list[dict[str, Any]]] = {}
    for (stage, redrive, kind), files in names.items():
        folder = f"{prefix}{stage}/r{redrive}/{kind}/"
        blobs = [await store.get(folder + name) for name in _in_order(files)]
        out[(stage, redrive, kind)] = _records(blobs)
    return out


def _journal_of(folders: list[str]) -> JournalKey | None:
    """The journal whose folder is ``<stage>/r<redrive>/<kind>`` (relative to the run's
    journals); None for any other folder."""
    if len(folders) != 3 or folders[2] not in _KINDS:
        return None
    redrive = _REDRIVE.fullmatch(folders[1])
    return None if redrive is None else (folders[0], int(redrive[1]), folders[2])


def _read_run_dir(root: str) -> dict[JournalKey, list[bytes]]:
    """``read_run_journals`` on a folder store: the blobs of each journal folder under
    ``root`` (the run's journals)."""
    out: dict[JournalKey, list[bytes]] = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for stage in os.listdir(root):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for redrive in os.listdir(os.path.join(root, stage)):
                    for kind in _KINDS:
                        where = _journal_of([stage, redrive, kind])
                        folder = os.path.join(root, stage, redrive, kind)
                        if where is not None and os.path.isdir(folder):
                            out[where] = StepJournal._read_dir(folder)
    return out
