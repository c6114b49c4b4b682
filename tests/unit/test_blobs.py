"""Claim-check blobs: folder and memory stores, key safety, spill references."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from engine_port import (
    DEFAULT_SPILL_THRESHOLD,
    ClaimCheck,
    FolderBlobStore,
    MemoryBlobStore,
    is_spill_ref,
    open_blob_store,
)
from engine_port.errors import EngineError, SpilledPayloadUnavailableError, UnsafeBlobKeyError

UNSAFE = ["../x", "/etc/passwd", "a/../../b", "a\\b", "", "a//b", "a/./b", ".", "a/", "x\x00y"]


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.fixture(params=["folder", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "folder":
        return FolderBlobStore(tmp_path / "blobs")
    return MemoryBlobStore()


async def test_put_get_has_delete_list_round_trip(store: Any) -> None:
    assert await store.list() == []
    await store.put("runs/r1/a.json", b'{"a":1}')
    await store.put("runs/r1/b.json", b"\x00\xffbinary")
    await store.put("runs/r2/a.json", b"2")
    await store.put("top", b"t")
    assert await store.get("runs/r1/a.json") == b'{"a":1}'
    assert await store.get("runs/r1/b.json") == b"\x00\xffbinary"
    assert await store.has("runs/r1/a.json")
    assert not await store.has("runs/r1/zzz")
    assert await store.list() == ["runs/r1/a.json", "runs/r1/b.json", "runs/r2/a.json", "top"]
    assert await store.list("runs/r1/") == ["runs/r1/a.json", "runs/r1/b.json"]
    assert await store.list("runs/r") == ["runs/r1/a.json", "runs/r1/b.json", "runs/r2/a.json"]
    await store.put("top", b"overwritten")
    assert await store.get("top") == b"overwritten"
    await store.delete("runs/r1/a.json")
    await store.delete("runs/r1/a.json")  # deleting twice is fine
    assert not await store.has("runs/r1/a.json")
    assert await store.list("runs/r1/") == ["runs/r1/b.json"]


async def test_folder_store_writes_files_under_its_root(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    await store.put("a/b/c.bin", b"data")
    assert (tmp_path / "a" / "b" / "c.bin").read_bytes() == b"data"
    # no temporary files are left behind, and a second store on the folder sees the blob
    assert files_under(tmp_path) == ["a/b/c.bin"]
    assert await FolderBlobStore(tmp_path).get("a/b/c.bin") == b"data"


async def test_folder_store_lists_keys_that_start_with_a_dot(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    await store.put(".hidden", b"h")
    await store.put("x/.also", b"a")
    assert await store.list() == [".hidden", "x/.also"]


async def test_folder_store_lists_a_prefix_by_walking_only_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's listing (the Temporal driver's outbox, dead letters, step journals) walked the
    whole store, every run's files, on the event loop."""
    store = FolderBlobStore(tmp_path)
    for key in ("runs/r1/a", "runs/r1/s/b", "runs/r10/a", "runs/r2/a", "dlq/x"):
        await store.put(key, b"1")
    import os

    walked: list[str] = []
    walk = os.walk

    def spy(top: Any, *args: Any, **kwargs: Any) -> Any:
        walked.append(Path(top).relative_to(tmp_path).as_posix())
        return walk(top, *args, **kwargs)

    monkeypatch.setattr(os, "walk", spy)
    assert await store.list("runs/r1/") == ["runs/r1/a", "runs/r1/s/b"]
    assert await store.list("runs/r1") == ["runs/r1/a", "runs/r1/s/b", "runs/r10/a"]
    assert await store.list("runs/none/") == []
    assert await store.list("dl") == ["dlq/x"]
    assert walked == ["runs/r1", "runs", "."]


async def test_folder_store_list_skips_a_folder_deleted_while_it_walks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge (another worker's retention) removes a run's folder while ``list`` walks the
    store: the folder's keys are gone, not an error (a FileNotFoundError failed a worker's
    retention once)."""
    import os
    import shutil

    store = FolderBlobStore(tmp_path)
    for run in ("r1", "r2", "r3"):
        await store.put(f"runs/{run}/outputs/a.json", b"1")
    real = os.scandir
    doomed = (tmp_path / "runs" / "r2").resolve()

    def scandir(path: Any = ".") -> Any:
        if isinstance(path, str | os.PathLike) and Path(path).resolve() == doomed:
            shutil.rmtree(doomed, ignore_errors=True)  # purged just before it is read
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    keys = await store.list("runs/")
    assert keys == ["runs/r1/outputs/a.json", "runs/r3/outputs/a.json"]


async def test_folder_store_concurrent_puts_of_one_key(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    payloads = [bytes([i]) * 1000 for i in range(16)]
    await asyncio.gather(*(store.put("same", p) for p in payloads))
    assert await store.get("same") in payloads
    assert await store.list() == ["same"]


@pytest.mark.parametrize("key", UNSAFE)
async def test_unsafe_keys_are_rejected(store: Any, key: str) -> None:
    with pytest.raises(UnsafeBlobKeyError):
        await store.put(key, b"x")
    with pytest.raises(UnsafeBlobKeyError):
        await store.get(key)
    with pytest.raises(UnsafeBlobKeyError):
        await store.has(key)
    with pytest.raises(UnsafeBlobKeyError):
        await store.delete(key)


async def test_traversal_writes_nothing_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FolderBlobStore(root)
    for key in UNSAFE:
        with pytest.raises(UnsafeBlobKeyError):
            await store.put(key, b"x")
    assert files_under(tmp_path) == []


async def test_symlink_escaping_the_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    store = FolderBlobStore(root)
    with pytest.raises(UnsafeBlobKeyError):
        await store.put("link/x", b"x")
    assert list(outside.iterdir()) == []


async def test_a_symlink_deeper_in_the_key_escaping_the_root_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "runs").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "runs" / "link").symlink_to(outside)
    store = FolderBlobStore(root)
    for key in ("runs/link/x", "runs/link/a/b"):
        with pytest.raises(UnsafeBlobKeyError):
            await store.put(key, b"x")
        with pytest.raises(UnsafeBlobKeyError):
            await store.get(key)
    assert list(outside.iterdir()) == []


async def test_a_symlink_inside_the_root_is_followed(tmp_path: Path) -> None:
    """A key's path is not resolved when none of its parts is a symlink (``_path``'s fast
    look); one that is, and stays inside the root, is followed as before."""
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "link").symlink_to(root / "real")
    store = FolderBlobStore(root)
    await store.put("link/x", b"1")
    assert (root / "real" / "x").read_bytes() == b"1"
    assert await store.get("link/x") == b"1"
    assert await store.get("real/x") == b"1"


async def test_put_leaves_no_temp_file(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    await store.put("runs/r/a.json", b"1")
    store.put_now("runs/r/b.json", b"2")
    assert files_under(tmp_path) == ["runs/r/a.json", "runs/r/b.json"]


async def test_get_of_a_missing_key_raises_spilled_payload_unavailable(store: Any) -> None:
    with pytest.raises(SpilledPayloadUnavailableError, match="nope/x") as exc:
        await store.get("nope/x")
    assert exc.value.key == "nope/x"


async def test_get_of_a_folder_key_raises_spilled_payload_unavailable(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    await store.put("dir/file", b"x")
    with pytest.raises(SpilledPayloadUnavailableError):
        await store.get("dir")
    with pytest.raises(SpilledPayloadUnavailableError):
        await store.get("dir/file/below")


# -- claim check -----------------------------------------------------------------------------


async def test_small_values_stay_inline_and_large_ones_spill(store: Any) -> None:
    cc = ClaimCheck(store, threshold=100)
    small = {"a": "x" * 10}
    assert await cc.dump(small, "runs/k/small") == small
    assert not await store.has("runs/k/small")

    large = {"a": "x" * 200}
    ref = await cc.dump(large, "runs/k/large")
    assert is_spill_ref(ref)
    assert ClaimCheck.key_of(ref) == "runs/k/large"
    assert ref["$wfe_spill"]["size"] > 100
    assert len(ref["$wfe_spill"]["sha256"]) == 64
    assert await store.has("runs/k/large")
    assert "x" * 200 not in str(ref)
    assert await cc.load(ref, run_id="k") == large
    assert await cc.load(small, run_id="k") == small
    assert ClaimCheck.key_of(small) is None


async def test_threshold_is_inclusive(store: Any) -> None:
    value = "y" * 8  # JSON: 10 bytes with the quotes
    assert await ClaimCheck(store, threshold=10).dump(value, "k") == value
    assert is_spill_ref(await ClaimCheck(store, threshold=9).dump(value, "k"))


async def test_force_always_spills(store: Any) -> None:
    cc = ClaimCheck(store)
    values: list[Any] = [None, 1, "s", [], {"a": 1}]
    for i, value in enumerate(values):
        ref = await cc.dump(value, f"runs/f/{i}", force=True)
        assert is_spill_ref(ref)
        assert await cc.load(ref, run_id="f") == value


async def test_large_value_round_trips_unchanged(store: Any) -> None:
    cc = ClaimCheck(store)
    big = {"rows": [{"i": i, "s": "é" * 50, "f": i / 3} for i in range(2000)]}
    ref = await cc.dump(big, "runs/r/stage/out")
    assert is_spill_ref(ref)
    assert await cc.load(ref, run_id="r") == big


async def test_load_through_an_empty_store_raises(store: Any) -> None:
    ref = await ClaimCheck(store, threshold=0).dump({"a": 1}, "runs/g/gone/1")
    with pytest.raises(SpilledPayloadUnavailableError, match="runs/g/gone/1"):
        await ClaimCheck(MemoryBlobStore()).load(ref, run_id="g")


async def test_dump_with_an_unsafe_key_raises(store: Any) -> None:
    with pytest.raises(UnsafeBlobKeyError):
        await ClaimCheck(store, threshold=0).dump({"a": 1}, "../escape")


def test_default_threshold_is_64_kib() -> None:
    assert DEFAULT_SPILL_THRESHOLD == 64 * 1024
    assert ClaimCheck(MemoryBlobStore()).threshold == 64 * 1024


def test_is_spill_ref_only_matches_the_reference_shape() -> None:
    assert is_spill_ref({"$wfe_spill": {"key": "k"}})
    assert not is_spill_ref({"$wfe_spill": {"key": "k"}, "other": 1})
    assert not is_spill_ref({"key": "k"})
    assert not is_spill_ref(["$wfe_spill"])
    assert not is_spill_ref(None)


# -- open_blob_store -------------------------------------------------------------------------


async def test_open_blob_store_file_url_absolute(tmp_path: Path) -> None:
    store = open_blob_store(f"file://{tmp_path}/blobs")
    assert isinstance(store, FolderBlobStore)
    await store.put("k", b"v")
    assert (tmp_path / "blobs" / "k").read_bytes() == b"v"


async def test_open_blob_store_file_url_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_blob_store("file://.wfe/blobs")
    assert isinstance(store, FolderBlobStore)
    assert store.root == (tmp_path / ".wfe" / "blobs").resolve()
    await store.put("k", b"v")
    assert (tmp_path / ".wfe" / "blobs" / "k").read_bytes() == b"v"


async def test_open_blob_store_memory_url() -> None:
    store = open_blob_store("memory://")
    assert isinstance(store, MemoryBlobStore)
    await store.put("k", b"v")
    assert await store.get("k") == b"v"
    assert open_blob_store("memory://") is not store  # no shared global state


def test_open_blob_store_unknown_scheme_raises() -> None:
    with pytest.raises(EngineError, match="unknown scheme"):
        open_blob_store("ftp://somewhere")


async def test_a_large_value_is_hashed_and_decoded_off_the_event_loop(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sha256 of a large spilled value and the decoding of its JSON run on a worker
    thread: on the event loop they held it (10 MB: several hundred ms beside CPU hogs), and
    with it the heartbeats of every lease of the worker. Small ones stay on the loop (the
    hop costs more than the work)."""
    from engine_port import _blobs

    loop_thread = threading.get_ident()
    on_loop: list[tuple[str, int, bool]] = []  # (what, bytes, on the loop's thread)
    digest, decode = _blobs._digest, _blobs.loads

    def noting_digest(data: bytes) -> str:
        on_loop.append(("sha256", len(data), threading.get_ident() == loop_thread))
        return digest(data)

    def noting_loads(data: bytes | str) -> Any:
        on_loop.append(("decode", len(data), threading.get_ident() == loop_thread))
        return decode(data)

    monkeypatch.setattr(_blobs, "_digest", noting_digest)
    monkeypatch.setattr(_blobs, "loads", noting_loads)
    cc = ClaimCheck(store, threshold=1024)
    large, small = "L" * _blobs.OFF_LOOP_BYTES, "s" * 2048
    large_ref = await cc.dump(large, "runs/r1/large")
    small_ref = await cc.dump(small, "runs/r1/small")
    assert await cc.load(large_ref, run_id="r1") == large
    assert await cc.load(small_ref, run_id="r1") == small
    size = len(large) + 2  # (its JSON: quoted)
    assert sorted(on_loop) == [
        ("decode", 2050, True),
        ("decode", size, False),
        ("sha256", 2050, True),
        ("sha256", size, False),
    ]
    assert large_ref["$wfe_spill"]["sha256"] == hashlib.sha256(f'"{large}"'.encode()).hexdigest()


async def test_a_folder_store_checks_a_key_it_reads_off_the_event_loop(tmp_path: Path) -> None:
    """A read's key checks (a stat of each part of the key: on a slow disk, each may wait)
    run on the thread that reads the file, not on the event loop."""
    loop_thread = threading.get_ident()
    checked: list[bool] = []

    class Noting(FolderBlobStore):
        def _path(self, key: str) -> Path:
            checked.append(threading.get_ident() == loop_thread)
            return super()._path(key)

    store = Noting(tmp_path / "blobs")
    await store.put("runs/r1/a", b"1")
    checked.clear()
    assert await store.get("runs/r1/a") == b"1"
    with pytest.raises(SpilledPayloadUnavailableError):
        await store.get("runs/r1/missing")
    assert checked == [False, False]
