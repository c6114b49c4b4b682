"""``list_versions`` lists every version the cluster knows of the engine's workflows, with no
registry too (``wfe versions`` without --app), as the native driver lists every version its
database knows: finished versions included, with 0 active runs."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from driver_temporal import TemporalEngine
from engine_port import Registry, StageContext, VersionInfo, Workflow

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


def versioned(workflow_id: str, version: str) -> Workflow[In]:
    wf = Workflow(workflow_id, input=In, version=version)

    @wf.stage
    async def only(ctx: StageContext[In]) -> str:
        return version

    return wf


async def _listed(
    engine: TemporalEngine, want: set[tuple[str, str]]
) -> dict[tuple[str, str], VersionInfo]:
    """list_versions(), polled until it lists ``want`` with their runs ended (visibility and
    the Worker Deployment listing are eventually consistent: a run that just completed can
    still count as active) or a deadline passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20.0
    while True:
        got = {(v.workflow_id, v.version): v for v in await engine.list_versions()}
        settled = want <= set(got) and all(got[k].active_runs == 0 for k in want)
        if settled or loop.time() > deadline:
            return got
        await asyncio.sleep(0.1)


async def test_finished_versions_are_listed_without_the_registry(
    make_engine: EngineFactory,
) -> None:
    """A version whose runs all finished was not listed by an engine without the app's
    registry (only versions with active runs were): it is, with 0 active runs, drained, not
    served here; the served version of the registry's engine is latest there."""
    e1 = make_engine(Registry([versioned("listed", "v1"), versioned("listed-other_x", "v7")]))
    bare = make_engine(Registry([]))
    async with e1:
        async with e1.worker():
            for wf_id in ("listed", "listed-other_x"):
                run = await e1.start(wf_id, {})
                assert (await e1.wait(run.id, timeout=30)).status == "completed"
        async with bare:
            want = {("listed", "v1"), ("listed-other_x", "v7")}
            got = await _listed(bare, want)
            assert want <= set(got), sorted(got)
            for key in want:
                v = got[key]
                assert (v.active_runs, v.drained, v.served_here, v.latest) == (
                    0,
                    True,
                    False,
                    False,
                ), v
            assert set(got) == want, sorted(got)  # (nothing of other task queues)
        mine = await _listed(e1, want)
        assert [(k, v.active_runs, v.served_here, v.latest) for k, v in sorted(mine.items())] == [
            (("listed", "v1"), 0, True, True),
            (("listed-other_x", "v7"), 0, True, True),
        ]
