"""A blob write that fails (a full disk, a blob folder made read-only) leaves nothing behind:
no temp file, no blob, and no empty folder it made (``runs/<run_id>/`` of a ``start()`` that
could not spill its large input), while folders holding other blobs stay. The start itself is
atomic: no run row either. (The failure is simulated: the tests run as any user, where a
read-only folder does not stop root.)"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from engine_port._blobs import FolderBlobStore
from engine_port.errors import DriverUnavailableError

from .conftest import MakeEngine, row_counts
from .workflows import big

BIG_NOTE = "n" * (200 * 1024)  # over the 64 KiB spill threshold: the input is spilled


def _fail_writes(monkeypatch: pytest.MonkeyPatch, err: int) -> list[Path]:
    """Every temp file write of a blob raises ``OSError(err)``; returns the paths tried."""
    tried: list[Path] = []
    real = Path.write_bytes

    def write_bytes(self: Path, data: Any) -> int:
        if self.name.endswith(".wfe-tmp"):
            tried.append(self)
            raise OSError(err, errno.errorcode.get(err, "error"), str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    return tried


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES])
async def test_a_failed_put_removes_the_folders_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    store = FolderBlobStore(tmp_path / "blobs")
    await store.put("runs/old/input", b"{}")
    tried = _fail_writes(monkeypatch, err)
    with pytest.raises((OSError, DriverUnavailableError)):  # (the latter for a full disk)
        await store.put("runs/new/steps/s/blob", b"x" * 100)
    with pytest.raises((OSError, DriverUnavailableError)):
        store.put_now("runs/old/more/blob", b"x")
    assert len(tried) == 2
    # the folders the failed writes made are gone; the one holding a blob stays
    assert _tree(store.root) == ["runs", "runs/old", "runs/old/input"]
    monkeypatch.undo()
    await store.put("runs/new/steps/s/blob", b"x" * 100)
    assert await store.list("runs/new/") == ["runs/new/steps/s/blob"]


async def test_a_failed_put_into_a_new_store_folder_keeps_the_store_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FolderBlobStore(tmp_path / "blobs")
    _fail_writes(monkeypatch, errno.ENOSPC)
    with pytest.raises(DriverUnavailableError):
        await store.put("runs/r/input", b"x")
    assert store.root.is_dir() and _tree(store.root) == []


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS])
async def test_a_start_that_cannot_spill_its_input_leaves_nothing(
    make_engine: MakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    engine = await make_engine(big)
    blobs = tmp_path / "blobs"
    kept = await engine.start(big, {"note": "small"})  # inline: no blob
    before = await row_counts(engine)
    tried = _fail_writes(monkeypatch, err)
    with pytest.raises(OSError if err != errno.ENOSPC else DriverUnavailableError):
        await engine.start(big, {"note": BIG_NOTE})
    assert tried, "the input was not spilled: the test no longer tests anything"
    assert _tree(blobs) == []  # no runs/<run_id>/ (and no runs/) left
    assert [r.id for r in await engine.list_runs()] == [kept.id]
    assert await row_counts(engine) == before  # no run row, stage, job or event of it
    monkeypatch.undo()
    again = await engine.start(big, {"note": BIG_NOTE})
    assert [p.name.startswith("input-") for p in (blobs / "runs" / again.id).iterdir()] == [True]


async def test_a_delete_removes_the_folders_it_empties(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path / "blobs")
    await store.put("runs/a/input", b"{}")
    await store.put("runs/a/stages/s/output-1", b"{}")
    await store.put("runs/b/input", b"{}")
    await store.delete("runs/a/stages/s/output-1")
    assert _tree(store.root) == ["runs", "runs/a", "runs/a/input", "runs/b", "runs/b/input"]
    await store.delete("runs/a/input")
    await store.delete("runs/b/input")
    await store.delete("runs/b/input")  # (gone already: nothing to do)
    assert store.root.is_dir() and _tree(store.root) == []


async def test_a_put_whose_new_folder_is_removed_meanwhile_makes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed write or a delete of another key beside this one found the folder empty (it
    was made, nothing written yet) and removed it: the put makes it again."""
    store = FolderBlobStore(tmp_path / "blobs")
    real = Path.write_bytes
    removed: list[Path] = []

    def write_bytes(self: Path, data: Any) -> int:
        if not removed:
            removed.append(self.parent)
            self.parent.rmdir()  # the other write's clean-up, just before this write
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    await store.put("runs/r/steps/one", b"1")
    assert removed == [store.root / "runs/r/steps"]
    assert await store.get("runs/r/steps/one") == b"1"


async def test_an_idempotent_repeat_with_a_large_input_leaves_no_folder(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """The repeat spills its input under a run id of its own before it finds the key taken;
    dropping that blob leaves no empty ``runs/<id>/`` behind."""
    engine = await make_engine(big)
    first = await engine.start(big, {"note": BIG_NOTE}, idempotency_key="k")
    again = await engine.start(big, {"note": BIG_NOTE}, idempotency_key="k")
    assert again.id == first.id
    assert [p.name for p in (tmp_path / "blobs" / "runs").iterdir()] == [first.id]
