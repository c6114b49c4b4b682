"""``wfe wait`` on a run that is still suspended says what it waits for: it asked "is a worker
running for it?" also of a run a worker had suspended on a signal (the fix there is a signal,
not a worker)."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner

from engine_port import EngineSettings, create_engine
from wfe_cli import EXIT_CODES, app
from wfe_cli._demo import build_demo


async def _suspended_on_its_signal() -> str:
    async with create_engine(EngineSettings(), build_demo()) as engine, engine.worker():
        run = await engine.start("demo-order", {"order_id": "A-1", "total": 10.0})
        deadline = asyncio.get_running_loop().time() + 30
        while (await engine.get_run(run.id)).status != "suspended":
            assert asyncio.get_running_loop().time() < deadline, "the run never suspended"
            await asyncio.sleep(0.02)
        return run.id


def test_wait_on_a_suspended_run_names_what_it_waits_for(env: dict[str, str]) -> None:
    run_id = asyncio.run(_suspended_on_its_signal())
    result = CliRunner().invoke(app, ["wait", run_id, "--timeout", "0"])
    assert result.exit_code == EXIT_CODES["wrong_state"], result.output
    assert f"run {run_id} is still suspended" in result.stderr, result.stderr
    assert "approve waits for signal:approval" in result.stderr, result.stderr
    assert "worker" not in result.stderr, result.stderr
