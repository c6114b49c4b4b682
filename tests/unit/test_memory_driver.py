"""The memory driver: a throwaway native engine for users' fast unit tests."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from driver_memory import MemoryEngine
from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
)


class In(BaseModel):
    n: int


def _registry() -> Registry:
    wf = Workflow("memory-double", input=In)

    @wf.stage()
    async def double(ctx: StageContext[In]) -> int:
        return ctx.input.n * 2

    @wf.stage(after=[double])
    async def approve(ctx: StageContext[In]) -> object:
        return await ctx.step.wait_for_signal("ok")

    return Registry([wf])


async def test_memory_driver_runs_a_workflow_and_leaves_nothing_behind(tmp_path: Path) -> None:
    settings = EngineSettings(driver="memory", database_url=f"sqlite:///{tmp_path / 'ignored.db'}")
    sink = MemorySink()
    engine = create_engine(settings, _registry(), event_sink=sink)
    assert isinstance(engine, MemoryEngine) and engine.driver_name == "memory"
    async with engine:
        folder = engine.folder
        assert folder is not None and folder.is_dir()
        run = await engine.start("memory-double", {"n": 21})
        async with engine.worker():
            await engine.signal(run.id, "ok", {"approved": True})
            info = await engine.wait(run.id, timeout=30)
    assert info.status == RunStatus.COMPLETED
    assert info.stage("double").output == 42
    assert not folder.exists()  # the store is gone with the engine
    assert not (tmp_path / "ignored.db").exists()  # database_url is not used


async def test_two_memory_engines_share_nothing() -> None:
    settings = EngineSettings(driver="memory")
    async with create_engine(settings, _registry()) as a, create_engine(settings, _registry()) as b:
        run = await a.start("memory-double", {"n": 1})
        assert [r.id for r in await a.list_runs()] == [run.id]
        assert await b.list_runs() == []
