"""``wfe migrate`` as an operator runs it (native -> Temporal): Ctrl-C never leaves a run
active on both drivers, and a run named with ``--run`` that cannot move says why."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from engine_port.errors import RunNotFoundError
from wfe_cli import EXIT_CODES

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 1


def _setup(tmp_path: Path, address: str) -> tuple[Registry, Workflow[In], dict[str, str]]:
    wf = Workflow(f"pmc-{uuid.uuid4().hex[:8]}", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "WFE_TEMPORAL_ADDRESS": address,
        "WFE_TASK_QUEUE": f"pmc-{uuid.uuid4().hex[:8]}",
    }
    return Registry([wf]), wf, env


def _engines(registry: Registry, env: dict[str, str]) -> tuple[Any, Any]:
    blob = env["WFE_BLOB_URL"]
    native = create_engine(
        EngineSettings(driver="native", database_url=env["WFE_DATABASE_URL"], blob_url=blob),
        registry,
    )
    temporal = create_engine(
        EngineSettings(
            driver="temporal",
            temporal_address=env["WFE_TEMPORAL_ADDRESS"],
            task_queue=env["WFE_TASK_QUEUE"],
            blob_url=blob,
        ),
        registry,
    )
    return native, temporal


async def _suspended_runs(
    registry: Registry, wf: Workflow[In], env: dict[str, str], n: int
) -> list[str]:
    native, _ = _engines(registry, env)
    async with native, native.worker():
        ids = [(await native.start(wf.id, {"n": i})).id for i in range(n)]
        deadline = time.monotonic() + 120
        for run_id in ids:
            while (await native.get_run(run_id)).status.value != "suspended":
                assert time.monotonic() < deadline, "the runs never suspended"
                await asyncio.sleep(0.1)
    return ids


def _migrate(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "wfe_cli", "migrate", "--from", "native", "--to", "temporal", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _where(
    registry: Registry, env: dict[str, str], ids: list[str]
) -> dict[str, tuple[str, str]]:
    native, temporal = _engines(registry, env)
    out = {}
    async with native, temporal:
        for run_id in ids:
            here = (await native.get_run(run_id)).status.value
            try:
                there = (await temporal.get_run(run_id)).status.value
            except RunNotFoundError:
                there = "absent"
            out[run_id] = (here, there)
    return out


async def test_ctrl_c_finishes_the_run_being_moved(temporal_server: Any, tmp_path: Path) -> None:
    registry, wf, env = _setup(tmp_path, temporal_server.address)
    ids = await _suspended_runs(registry, wf, env, 60)
    proc = _migrate(env)
    try:
        deadline = time.monotonic() + 120
        moved_one = False
        while not moved_one:  # interrupt once the first runs moved (mid-migration)
            assert time.monotonic() < deadline and proc.poll() is None, "nothing ever moved"
            where = await _where(registry, env, ids[:5] + ids[-5:])
            moved_one = any(h == "migrated" for h, _ in where.values())
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    where = await _where(registry, env, ids)
    both = [r for r, (h, t) in where.items() if h != "migrated" and t != "absent"]
    assert not both, f"active on both drivers after Ctrl-C: {both}\n{out}\n{err}"
    assert all(
        (h, t) in {("migrated", "suspended"), ("suspended", "absent")} for h, t in where.values()
    ), where
    if proc.returncode == 130:  # (it may have finished before the signal arrived)
        assert "run the same command again" in err
    rerun = _migrate(env, "--json")
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    where = await _where(registry, env, ids)
    assert set(where.values()) == {("migrated", "suspended")}, where
    _, temporal = _engines(registry, env)
    async with temporal, temporal.worker():
        await temporal.signal(ids[0], "go", {"ok": 1})
        assert (await temporal.wait(ids[0], timeout=60)).output == {"ok": 1}


async def test_a_named_run_that_cannot_move_says_why(temporal_server: Any, tmp_path: Path) -> None:
    registry, wf, env = _setup(tmp_path, temporal_server.address)
    (done, moving) = await _suspended_runs(registry, wf, env, 2)
    native, _ = _engines(registry, env)
    async with native, native.worker():
        await native.signal(done, "go", 1)
        assert (await native.wait(done, timeout=60)).status.value == "completed"
    proc = _migrate(env, "--run", done, "--run", moving, "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    moves = {m["run_id"]: m for m in json.loads(out)["moves"]}
    assert moves[moving]["outcome"] == "moved"
    assert moves[done]["outcome"] == "skipped"
    assert "completed" in moves[done]["reason"]
    proc = _migrate(env, "--run", moving, "--json")
    out, err = proc.communicate(timeout=120)
    (again,) = json.loads(out)["moves"]
    assert again["outcome"] == "skipped" and "already moved to temporal" in again["reason"]


def _wfe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wfe_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_a_run_left_frozen_by_a_killed_migration_can_be_given_back(
    temporal_server: Any, tmp_path: Path
) -> None:
    """``wfe migrate`` killed (kill -9, a host crash) between a run's freeze and its move left
    the run frozen on native for good: its signals were refused with "retry in a moment",
    which never came true, and no command unfroze it. The refusal now says how to finish or
    abort the move, and ``wfe migrate --abort --run`` gives the run back to its source."""
    registry, wf, env = _setup(tmp_path, address=temporal_server.address)
    (run_id,) = await _suspended_runs(registry, wf, env, 1)
    native, temporal = _engines(registry, env)
    async with native:
        await native.export_run(run_id)  # frozen, and the migration that froze it is gone
    refused = _wfe(env, "signal", run_id, "go", '{"ok": 1}')
    assert refused.returncode == EXIT_CODES["wrong_state"], refused.stderr
    assert f"wfe migrate --from native --to TARGET --run {run_id}" in refused.stderr
    assert "--abort" in refused.stderr
    proc = _migrate(env, "--abort", "--run", run_id[:12], "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (move,) = json.loads(out)["moves"]
    assert (move["run_id"], move["outcome"]) == (run_id, "unfrozen"), move
    sent = _wfe(env, "signal", run_id, "go", '{"ok": 1}')
    assert sent.returncode == 0, sent.stderr
    native, temporal = _engines(registry, env)
    async with native, temporal, native.worker():
        assert (await native.wait(run_id, timeout=60)).output == {"ok": 1}
        with pytest.raises(RunNotFoundError):
            await temporal.get_run(run_id)


async def test_abort_leaves_a_run_its_target_already_holds_frozen(
    temporal_server: Any, tmp_path: Path
) -> None:
    """A migration killed after the target's import committed: unfreezing the run would leave
    it live on both drivers, so ``--abort`` refuses it and a rerun finishes the move."""
    registry, wf, env = _setup(tmp_path, address=temporal_server.address)
    (run_id,) = await _suspended_runs(registry, wf, env, 1)
    native, temporal = _engines(registry, env)
    async with native, temporal:
        await temporal.import_run(await native.export_run(run_id))
    proc = _migrate(env, "--abort", "--run", run_id, "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (move,) = json.loads(out)["moves"]
    assert move["outcome"] == "skipped" and "without --abort" in move["reason"], move
    assert (await _where(registry, env, [run_id]))[run_id] == ("suspended", "suspended")
    assert _wfe(env, "signal", run_id, "go", "1").returncode == EXIT_CODES["wrong_state"]
    proc = _migrate(env, "--run", run_id[:10], "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (move,) = json.loads(out)["moves"]
    assert (move["run_id"], move["outcome"]) == (run_id, "moved"), move
    assert (await _where(registry, env, [run_id]))[run_id] == ("migrated", "suspended")


async def test_run_takes_a_unique_prefix_like_every_other_command(
    temporal_server: Any, tmp_path: Path
) -> None:
    """``wfe show 3f2a`` finds the run; ``wfe migrate --run 3f2a`` said "no run with id"."""
    registry, wf, env = _setup(tmp_path, address=temporal_server.address)
    (run_id,) = await _suspended_runs(registry, wf, env, 1)
    proc = _migrate(env, "--dry-run", "--run", run_id[:8], "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    (move,) = json.loads(out)["moves"]
    assert (move["run_id"], move["outcome"]) == (run_id, "would_move"), move
