"""``wfe drain WORKFLOW --lift`` says when there was nothing to lift: it said "lifted the
drain of WORKFLOW" of a workflow that was not drained. It still exits 0 (the workflow takes
new runs here, as asked); whether a workflow was drained comes from ``list_versions()``'s
``new_runs_to`` before the lift."""

from __future__ import annotations

import asyncio
import json

from pydantic import BaseModel
from typer.testing import CliRunner

from engine_port import Registry, StageContext, Workflow, create_engine, load_settings
from wfe_cli import app


class In(BaseModel):
    n: int = 0


def _known(*workflow_ids: str) -> None:
    """A run of each workflow (so the database knows a version of it); no worker runs it."""
    flows: list[Workflow[In]] = []
    for wf_id in workflow_ids:
        wf: Workflow[In] = Workflow(wf_id, input=In)

        @wf.stage()
        async def only(ctx: StageContext[In]) -> int:
            return 1

        flows.append(wf)

    async def start() -> None:
        async with create_engine(load_settings(), Registry(flows)) as engine:
            for wf in flows:
                await engine.start(wf.id, {})

    asyncio.run(start())


def test_lifting_a_drain_that_is_not_there_says_so(env: dict[str, str]) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    _known("lift-a", "lift-b")

    idle = runner.invoke(app, ["drain", "lift-a", "--lift"])
    assert idle.exit_code == 0, idle.output
    assert "lifted" not in idle.output, idle.output
    assert "lift-a: not drained, nothing to lift" in idle.output, idle.output

    drained = runner.invoke(app, ["drain", "lift-a", "--target", "temporal"])
    assert drained.exit_code == 0, drained.output
    both = runner.invoke(app, ["drain", "lift-a", "lift-b", "--lift"])
    assert both.exit_code == 0, both.output
    lines = both.output.splitlines()
    assert "lifted the drain of lift-a" in lines, lines
    assert any(x.startswith("lift-b: not drained, nothing to lift") for x in lines), lines

    again = runner.invoke(app, ["drain", "lift-a", "--lift", "--json"])
    assert again.exit_code == 0, again.output
    said = json.loads(again.stdout)
    assert said["lifted"] == [] and said["not_drained"] == ["lift-a"], said
    assert said["drained"] is False  # (the keys a lift printed before stay)


def test_a_lift_of_a_workflow_unknown_here_does_not_claim_either_way(
    env: dict[str, str],
) -> None:
    """A workflow with no run here is not in ``list_versions()`` (drained or not)."""
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    assert runner.invoke(app, ["drain", "nowhere", "--target", "temporal"]).exit_code == 0
    lifted = runner.invoke(app, ["drain", "nowhere", "--lift"])
    assert lifted.exit_code == 0, lifted.output
    assert "lifted the drain of nowhere, if any (no run of it is known here)" in lifted.output
