"""A CreateRun that names an existing run id fails without touching that run's input."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from driver_native import CreateRun, NativeEngine
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from engine_port.errors import RunExistsError


class Big(BaseModel):
    blob: str


async def test_create_run_with_a_taken_id_keeps_the_first_input(
    database_url: str, tmp_path: Path
) -> None:
    wf = Workflow("taken-id", input=Big)

    @wf.stage
    async def a(ctx: StageContext[Big]) -> int:
        return len(ctx.input.blob)

    settings = EngineSettings(database_url=database_url, blob_url=f"file://{tmp_path / 'b'}")
    engine = create_engine(settings, Registry([wf]))
    assert isinstance(engine, NativeEngine)
    async with engine:
        first = "a" * 100_000  # over the 64 KiB threshold: spilled to the blob store
        run_id, created = await engine.kernel.dispatch(CreateRun(wf.id, {"blob": first}))
        assert created
        with pytest.raises(RunExistsError):
            await engine.kernel.dispatch(CreateRun(wf.id, {"blob": "b" * 100_000}, run_id=run_id))
        assert (await engine.get_run(run_id)).input == {"blob": first}
        keys = await engine.kernel.claim.store.list(f"runs/{run_id}/")
        assert len(keys) == 1  # the failed attempt left no blob behind
