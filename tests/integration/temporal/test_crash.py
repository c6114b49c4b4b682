"""S17: a worker process SIGKILLed inside stage b after step x; another worker finishes the run
with x not run again, the same attempt and the same event ids (trace equals S1's)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from . import crash_app
from .conftest import EngineFactory

pytestmark = pytest.mark.temporal

ROOT = Path(__file__).resolve().parents[3]


async def wait_path(path: Path, proc: asyncio.subprocess.Process, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(path.exists):
        if proc.returncode is not None:
            raise AssertionError(f"worker exited early with {proc.returncode}")
        if loop.time() > deadline:
            raise AssertionError(f"{path} did not appear")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("local", [False, True], ids=["activity", "local-activity"])
async def test_s17_sigkill_mid_stage_resumes_on_another_worker(
    make_engine: EngineFactory,
    tmp_path: Path,
    blob_dir: Path,
    temporal_address: str,
    monkeypatch: pytest.MonkeyPatch,
    local: bool,
) -> None:
    """A regular activity is retried after its heartbeat timeout; a local one is run again when
    the dead worker's workflow task times out and another worker replays the history."""
    counts = tmp_path / "counts"
    counts.mkdir()
    monkeypatch.setenv("WFE_TEST_COUNT_DIR", str(counts))
    if local:
        monkeypatch.setenv("WFE_TEST_LOCAL", "1")
    else:
        monkeypatch.delenv("WFE_TEST_LOCAL", raising=False)
    sink = crash_app.FileSink(counts / "events.jsonl")
    engine = make_engine(crash_app.build_registry(), sink=sink, options={"heartbeat_timeout": 2.0})
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WFE_TEST_HANG": "1",
        "WFE_TEMPORAL_ADDRESS": temporal_address,
        "WFE_TASK_QUEUE": engine.settings.task_queue,
        "WFE_BLOB_URL": f"file://{blob_dir}",
    }
    async with engine:
        run = await engine.start("crashy", {})
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(crash_app.__file__)),
            env=env,
            cwd=str(tmp_path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await wait_path(counts / "in-b", proc, timeout=60)
            await asyncio.sleep(2.0)  # let the heartbeat carrying step x reach the server
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        assert crash_app.count("x") == 1 and crash_app.count("y") == 0
        async with engine.worker(sticky_queue_timeout=2.0):
            info = await engine.wait(run.id, timeout=90)
    assert info.status == "completed", info.error
    assert info.output == 31
    assert info.stage("b").attempt == 1
    assert crash_app.count("x") == 1
    assert crash_app.count("y") == 1
    assert crash_app.count("b") >= 2
    assert crash_app.count("a") == 1 and crash_app.count("c") == 1
    events = sink.events(run.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [(e.type, e.stage) for e in events] == [
        ("run.created", None),
        ("run.started", None),
        ("stage.started", "a"),
        ("stage.completed", "a"),
        ("stage.started", "b"),
        ("stage.completed", "b"),
        ("stage.started", "c"),
        ("stage.completed", "c"),
        ("run.completed", None),
    ]


async def test_signal_taken_mid_stage_survives_a_killed_worker(
    make_engine: EngineFactory,
    tmp_path: Path,
    blob_dir: Path,
    temporal_address: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Signal "go" arrives while b's body runs (before its wait): the wait takes it from the run
    (``wfe.take_signal``), then the worker is SIGKILLed. The retried try on another worker
    replays the wait with the same payload; the run consumed the signal exactly once (its
    queue is empty at the end) and b never suspended."""
    counts = tmp_path / "counts"
    counts.mkdir()
    monkeypatch.setenv("WFE_TEST_COUNT_DIR", str(counts))
    monkeypatch.setenv("WFE_TEST_SIGNAL", "1")
    monkeypatch.delenv("WFE_TEST_LOCAL", raising=False)
    sink = crash_app.FileSink(counts / "events.jsonl")
    engine = make_engine(crash_app.build_registry(), sink=sink, options={"heartbeat_timeout": 2.0})
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WFE_TEST_HANG": "1",
        "WFE_TEMPORAL_ADDRESS": temporal_address,
        "WFE_TASK_QUEUE": engine.settings.task_queue,
        "WFE_BLOB_URL": f"file://{blob_dir}",
    }
    async with engine:
        run = await engine.start("crashy", {})
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(crash_app.__file__)),
            env=env,
            cwd=str(tmp_path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await wait_path(counts / "at-barrier", proc, timeout=60)
            sent = await engine.signal(run.id, "go", {"n": 100})
            assert (sent.delivered, sent.already_completed) == (False, False)
            (counts / "release").write_text("go")
            await wait_path(counts / "in-b", proc, timeout=60)  # the take is journaled
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        assert crash_app.count("x") == 1 and crash_app.count("y") == 0
        async with engine.worker(sticky_queue_timeout=2.0):
            info = await engine.wait(run.id, timeout=90)
    assert info.status == "completed", info.error
    assert info.output == 131  # x + y + the payload, taken once
    assert info.stage("b").attempt == 1
    assert crash_app.count("x") == 1 and crash_app.count("y") == 1
    events = sink.events(run.id)
    assert "stage.suspended" not in [e.type for e in events]
    state = json.loads((blob_dir / "runs" / run.id / "state.json").read_text())
    assert state["signals"] == []  # consumed, neither lost nor queued again
