"""A full disk (ENOSPC) under the embedded default (DESIGN §5): on a real small filesystem (a
tmpfs mounted for each test), a disk-full error of the engine's own storage is an
infrastructure fault, never the user's stage's: no ``stage.failed``, no retry used up, the run
not failed by it; ``start``/``signal`` raise a typed EngineError that says the disk is full and
what to do, nothing half-written stays behind, and once space is freed the runs go on by
themselves without re-running journaled steps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_native import NativeEngine
from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine
from engine_port._blobs import FolderBlobStore
from engine_port.errors import DriverUnavailableError

from .conftest import types

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mounts a tmpfs (Linux only)")

RAN: Counter[str] = Counter()
GATE: dict[str, asyncio.Event] = {}
BIG = 200_000  # bytes: over the default 64 KiB spill threshold, so spilled to the blob store
REPO = Path(__file__).resolve().parents[3]


class In(BaseModel):
    blob: str = ""


def _workflow() -> Workflow[In]:
    wf = Workflow("disk-full", input=In)

    # one attempt only: a storage fault charged to the stage would fail the run at once
    @wf.stage(retry=Retry(max_attempts=1))
    async def steps(ctx: StageContext[In]) -> str:
        def one() -> str:
            RAN["one"] += 1
            return "one"

        def big() -> str:
            RAN["big"] += 1
            return "b" * BIG

        first = await ctx.step.run("one", one)
        gate = GATE.get(ctx.input.blob)
        if gate is not None:
            await gate.wait()
        second = await ctx.step.run("big", big)
        return f"{first}{second}!"  # a spilled output too

    @wf.stage(retry=Retry(max_attempts=1), signals=["go"])
    async def waits(ctx: StageContext[In]) -> int:
        payload = await ctx.step.wait_for_signal("go")
        return len(json.dumps(payload))

    return wf


WF = _workflow()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RAN.clear()
    GATE.clear()
    yield
    RAN.clear()
    GATE.clear()


class SmallDisk:
    """A mounted 8 MiB tmpfs that ``fill()`` fills to the last byte and ``free()`` empties."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self) -> None:
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for chunk in (1 << 20, 1 << 12, 1):
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * chunk):
                        pass
        finally:
            os.close(fd)
        assert os.statvfs(self.path).f_bavail == 0

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def leftovers(self) -> list[str]:
        """Temp files of blob writes left on the disk."""
        return [p.name for p in self.path.rglob("*") if p.name.endswith(".wfe-tmp")]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root (mount -t tmpfs)")
    where = tmp_path / "full"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield SmallDisk(where)
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[NativeEngine]]]:
    made: list[NativeEngine] = []

    async def make(db: Path, blobs: Path, **settings: Any) -> NativeEngine:
        s = EngineSettings(database_url=f"sqlite:///{db}", blob_url=f"file://{blobs}", **settings)
        eng = create_engine(s, Registry([WF]))
        assert isinstance(eng, NativeEngine)
        await eng.connect()
        made.append(eng)
        return eng

    yield make
    for eng in reversed(made):
        await eng.close()


async def eventually(check: Callable[[], Any], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s"
        await asyncio.sleep(0.02)


def _says_disk_full(exc: BaseException, folder: Path) -> None:
    text = str(exc)
    assert "full disk" in text and "free disk space" in text, text
    assert str(folder) in text, text


async def test_folder_store_on_a_full_disk_raises_typed_and_keeps_no_partial_blob(
    disk: SmallDisk,
) -> None:
    store = FolderBlobStore(disk.path / "blobs")
    await store.put("runs/r/small", b"{}")
    disk.fill()
    with pytest.raises(DriverUnavailableError) as raised:
        await store.put("runs/r/big", b"x" * BIG)
    _says_disk_full(raised.value, store.root)
    with pytest.raises(DriverUnavailableError):
        store.put_now("runs/r/big", b"x" * BIG)
    # nothing half-written: no blob under the key, no temp file left taking the space
    assert not await store.has("runs/r/big")
    assert await store.list("runs/") == ["runs/r/small"]
    assert disk.leftovers() == []
    disk.free()
    await store.put("runs/r/big", b"x" * BIG)
    assert await store.get("runs/r/big") == b"x" * BIG


async def test_start_and_signal_with_big_values_on_a_full_blob_disk(
    disk: SmallDisk, tmp_path: Path, engines: Callable[..., Awaitable[NativeEngine]]
) -> None:
    """Only the blob folder is on the full disk: a big input or signal payload cannot be
    spilled, so the call raises DriverUnavailableError and writes nothing (no run without its
    input, nothing queued); after freeing space the same calls work and the runs complete."""
    blobs = disk.path / "blobs"
    eng = await engines(tmp_path / "wfe.db", blobs)
    waiting = await eng.start(WF, {"blob": "small"})
    disk.fill()
    with pytest.raises(DriverUnavailableError) as raised:
        await eng.start(WF, {"blob": "i" * BIG})
    _says_disk_full(raised.value, blobs)
    assert [r.id for r in await eng.list_runs()] == [waiting.id]
    with pytest.raises(DriverUnavailableError) as raised:
        await eng.signal(waiting.id, "go", {"p": "s" * BIG})
    _says_disk_full(raised.value, blobs)
    assert disk.leftovers() == []
    disk.free()
    big_run = await eng.start(WF, {"blob": "i" * BIG})
    result = await eng.signal(waiting.id, "go", {"p": "s" * BIG})
    assert not result.already_completed
    await eng.signal(big_run.id, "go", None)
    async with eng.worker():
        done = await eng.wait(waiting.id, timeout=20)
        assert done.status == "completed", done.error
        # the first signal was never queued: the wait took the one sent after freeing space
        assert {s.id: s.output for s in done.stages}["waits"] == len(json.dumps({"p": "s" * BIG}))
        other = await eng.wait(big_run.id, timeout=20)
        assert other.status == "completed", other.error
        assert other.input == {"blob": "i" * BIG}


def test_cli_reports_a_full_blob_disk_in_one_line(disk: SmallDisk, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "i" * BIG}))
    disk.fill()
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{disk.path / 'blobs'}",
        "WFE_APP": f"{__name__}:WF",
        "PYTHONPATH": str(REPO),
    }
    env.pop("WFE_TRACEBACK", None)
    done = subprocess.run(
        [sys.executable, "-m", "wfe_cli", "start", "disk-full", f"@{big}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 5, done.stderr  # unavailable (wfe_cli/_errors.py)
    assert len(lines) == 1 and "full disk" in lines[0] and "free disk space" in lines[0], lines
    assert "Traceback" not in done.stderr and "this is a bug" not in done.stderr


@pytest.mark.parametrize("where", ["blobs", "all"])
async def test_a_full_disk_mid_run_is_not_charged_to_the_stage(
    where: str,
    disk: SmallDisk,
    tmp_path: Path,
    engines: Callable[..., Awaitable[NativeEngine]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The disk fills while an attempt runs (between two steps): the attempt is abandoned
    (no stage.failed, although the stage has one attempt only), again while the disk stays
    full (with the database on that disk too, no job can be claimed again until there is
    room); once space is freed the run completes by itself, the journaled step not re-run."""
    db = (disk.path if where == "all" else tmp_path) / "wfe.db"
    # a short lease: on a full database file the worker cannot even give the lease back, so
    # the job waits for the lease to expire (the documented takeover)
    eng = await engines(db, disk.path / "blobs", stale_lease_threshold=2.0)
    key = f"gated-{uuid.uuid4().hex}"
    GATE[key] = gate = asyncio.Event()
    async with eng.worker():
        info = await eng.start(WF, {"blob": key})
        await eng.signal(info.id, "go", {"p": 1})
        await eventually(lambda: RAN["one"] == 1)
        await asyncio.sleep(0.2)  # the step's journal write commits before the gate is waited
        disk.fill()
        gate.set()
        await eventually(lambda: "stage abandoned" in caplog.text, timeout=20)
        if where == "blobs":
            await eventually(lambda: RAN["big"] >= 2, timeout=20)  # abandoned, tried again
            assert (await eng.get_run(info.id)).status == "running"
        disk.free()
        done = await eng.wait(info.id, timeout=25)
    assert done.status == "completed", done.error
    assert {s.id: s.output for s in done.stages}["steps"] == "one" + "b" * BIG + "!"
    assert RAN["one"] == 1  # journaled before the disk filled: not run again
    events = await eng.events(info.id)
    assert "stage.failed" not in types(events) and "run.failed" not in types(events)
    assert types(events, "steps").count("stage.started") == 1  # the attempt number was kept
    assert disk.leftovers() == []


async def test_start_on_a_full_database_disk_raises_typed(
    disk: SmallDisk, engines: Callable[..., Awaitable[NativeEngine]]
) -> None:
    eng = await engines(disk.path / "wfe.db", disk.path / "blobs")
    disk.fill()
    try:
        with pytest.raises(DriverUnavailableError, match=r"disk is full.*free disk space"):
            await eng.start(WF, {"blob": "small"})
    finally:
        disk.free()
        with contextlib.suppress(Exception):
            await eng.close()
