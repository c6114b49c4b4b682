"""``wfe show`` and ``wfe runs`` say which runs are frozen for a move, and how to finish or
give back the move: before, an operator learnt of a run an interrupted migration left frozen
only when one of its signals was refused."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from engine_port import (
    EngineSettings,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    abort_migration,
    create_engine,
)
from wfe_cli import app


class In(BaseModel):
    n: int = 0


def _registry() -> Registry:
    wf = Workflow("frozen-gate", input=In)

    @wf.stage(signals=["go"])
    async def gate(ctx: StageContext[In]) -> Any:
        return await ctx.step.wait_for_signal("go")

    return Registry([wf])


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WFE_DATABASE_URL", f"sqlite:///{tmp_path / 'wfe.db'}")
    monkeypatch.setenv("WFE_BLOB_URL", f"file://{tmp_path / 'blobs'}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _frozen_and_live_runs() -> tuple[str, str]:
    """Two suspended runs of which the first is frozen, as a migration killed between its
    freeze and its move leaves it."""

    async def go() -> tuple[str, str]:
        async with create_engine(EngineSettings(), _registry()) as engine:
            ids = [(await engine.start("frozen-gate", {"n": i})).id for i in range(2)]
            async with engine.worker():
                deadline = time.monotonic() + 60
                for run_id in ids:
                    while (await engine.get_run(run_id)).status != RunStatus.SUSPENDED:
                        assert time.monotonic() < deadline, "the runs never suspended"
                        await asyncio.sleep(0.05)
            await engine.export_run(ids[0])
            return ids[0], ids[1]

    return asyncio.run(go())


def _abort(run_id: str) -> None:
    async def go() -> None:
        source = create_engine(EngineSettings(), _registry())
        target = create_engine(EngineSettings(driver="memory"), _registry())
        async with source, target:
            report = await abort_migration(source, target, [run_id])
            assert [m.outcome for m in report.moves] == ["unfrozen"]

    asyncio.run(go())


def _status_column(stdout: str) -> dict[str, str]:
    """run id -> status, from the tab-separated rows ``wfe runs`` prints when piped."""
    header, *lines = (line.split("\t") for line in stdout.splitlines())
    at = header.index("status")
    return {cells[0]: cells[at] for cells in lines}


def test_show_and_runs_say_a_run_is_frozen_and_how_to_free_it(env: Path) -> None:
    frozen, live = _frozen_and_live_runs()
    runner = CliRunner()

    shown = runner.invoke(app, ["show", frozen])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["frozen"] is True
    note = " ".join(shown.stderr.split())
    assert f"frozen: run {frozen} is being moved to another driver" in note
    assert f"`wfe migrate --from native --to TARGET --run {frozen}` finishes the move" in note
    assert "--abort gives the run back to native" in note
    other = runner.invoke(app, ["show", live, "--json"])
    assert other.exit_code == 0, other.output
    assert json.loads(other.stdout)["frozen"] is False
    assert "frozen" not in other.stderr

    listing = runner.invoke(app, ["runs"])
    assert listing.exit_code == 0, listing.output
    assert _status_column(listing.stdout) == {frozen: "suspended (frozen)", live: "suspended"}
    as_json = runner.invoke(app, ["runs", "--json"])
    assert as_json.exit_code == 0, as_json.output
    rows = {r["id"]: r for r in map(json.loads, as_json.stdout.splitlines())}
    assert {i: (r["status"], r["frozen"]) for i, r in rows.items()} == {
        frozen: ("suspended", True),
        live: ("suspended", False),
    }

    # the move given back (what `wfe migrate --abort` does; its target here is the memory
    # driver, which that command refuses): the run is no longer shown frozen
    _abort(frozen)
    after = runner.invoke(app, ["show", frozen, "--json"])
    assert after.exit_code == 0, after.output
    assert json.loads(after.stdout)["frozen"] is False
    assert "frozen" not in after.stderr
    listing = runner.invoke(app, ["runs"])
    assert _status_column(listing.stdout) == {frozen: "suspended", live: "suspended"}
