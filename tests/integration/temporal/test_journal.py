"""The step journal (``driver_temporal._journal``): one append-only file per stage journal on a
folder store, one blob per step elsewhere; torn lines are ignored, later records win."""

from __future__ import annotations

import os
from pathlib import Path

from driver_temporal._journal import StepJournal
from driver_temporal._wire import journal_prefix
from engine_port import FolderBlobStore, MemoryBlobStore


def rec(name: str, completed: bool = True, result: object = 1) -> dict[str, object]:
    return {"name": name, "kind": "run", "completed": completed, "result": result}


async def test_folder_journal_is_one_appended_file(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    prefix = journal_prefix("run1", "s", 0, "stage")
    j = StepJournal(store, prefix)
    assert await j.read() == []  # nothing yet, no folder
    for i in range(200):
        await j.append(rec(f"s{i}", result=i))
    await j.append(rec("s0", result="again"))
    j.close()
    folder = tmp_path / prefix
    assert os.listdir(folder) == ["journal.jsonl"]
    with (folder / "journal.jsonl").open("ab") as f:
        f.write(b'{"name": "torn", "kind": "ru')  # a crash mid-write
    got = await StepJournal(store, prefix).read()
    assert [r["name"] for r in got] == [f"s{i}" for i in range(200)] + ["s0"]
    assert got[-1]["result"] == "again"
    # a second try appends to the same journal
    j2 = StepJournal(store, prefix)
    await j2.append(rec("late"))
    j2.close()
    assert (await StepJournal(store, prefix).read())[-1]["name"] == "late"


async def test_folder_journal_reads_one_file_per_step_records(tmp_path: Path) -> None:
    store = FolderBlobStore(tmp_path)
    prefix = journal_prefix("run2", "s", 1, "compensate")
    await store.put(prefix + "old.json", b'{"name":"old","kind":"run","completed":true}')
    j = StepJournal(store, prefix)
    await j.append(rec("new"))
    j.close()
    assert [r["name"] for r in await StepJournal(store, prefix).read()] == ["old", "new"]


async def test_other_stores_get_one_blob_per_step() -> None:
    store = MemoryBlobStore()
    prefix = journal_prefix("run3", "s", 0, "stage")
    j = StepJournal(store, prefix)
    await j.append(rec("a"))
    await j.append(rec("b", completed=False))
    await j.append(rec("b"))
    j.close()
    assert len(await store.list(prefix)) == 2
    got = {r["name"]: r for r in await StepJournal(store, prefix).read()}
    assert got["b"]["completed"] is True
