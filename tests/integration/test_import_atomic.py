"""An import that fails writes nothing: every spilled value a snapshot refers to is checked
readable before the target writes the run. A snapshot whose run id was edited (its references
then lie under another run's prefix) was written, and only then raised
SpilledPayloadUnavailableError: the run stayed behind on the target, and reading it failed."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
)
from engine_port.errors import RunNotFoundError, SpilledPayloadUnavailableError


class Big(BaseModel):
    text: str


def _workflow() -> Workflow[Big]:
    """``a`` returns a value that spills; ``b`` waits for signal ``go``."""
    wf = Workflow(f"imp-{uuid.uuid4().hex[:8]}", input=Big, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Big]) -> Any:
        return {"echo": ctx.input.text}

    @wf.stage(after=[a])
    async def b(ctx: StageContext[Big]) -> Any:
        return {"got": await ctx.step.wait_for_signal("go")}

    return wf


async def _until(engine: WorkflowEngine, run_id: str, status: RunStatus) -> None:
    deadline = time.monotonic() + 30
    while (await engine.get_run(run_id)).status != status:
        assert time.monotonic() < deadline, f"run {run_id} never became {status}"
        await asyncio.sleep(0.05)


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("temporal", marks=pytest.mark.temporal),
    ]
)
def target_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """target_settings(blobs): the settings of an engine of each driver (its blob folder
    ``blobs`` under tmp_path); a sync fixture, which may start the session's servers."""
    kind = request.param
    extra = request.getfixturevalue("temporal_server") if kind == "temporal" else None
    pg = request.getfixturevalue("pg_session") if kind == "postgres" else None
    return lambda blobs: _target(kind, extra, pg, tmp_path, blobs)


def _target(kind: str, server: Any, pg: Any, tmp_path: Path, blobs: str) -> EngineSettings:
    if kind == "temporal":
        settings = EngineSettings(
            driver="temporal",
            temporal_address=server.address,
            task_queue=f"imp-{uuid.uuid4().hex[:10]}",
            blob_url=f"file://{tmp_path / blobs}",
            spill_threshold_bytes=100,
        )
    else:
        url = f"sqlite:///{tmp_path / 'dst.db'}"
        if kind == "postgres":
            url = pg.new_schema()
        settings = EngineSettings(
            database_url=url, blob_url=f"file://{tmp_path / blobs}", spill_threshold_bytes=100
        )
    return settings


async def _absent(engine: WorkflowEngine, run_id: str) -> None:
    with pytest.raises(RunNotFoundError):
        await engine.get_run(run_id)
    assert run_id not in [r.id for r in await engine.list_runs(outputs=False)]


@pytest.mark.parametrize("fault", ["renamed", "blobs not copied"])
async def test_a_failed_import_leaves_no_run(
    target_settings: Any, fault: str, tmp_path: Path
) -> None:
    wf = _workflow()
    registry = Registry([wf])
    source = create_engine(
        EngineSettings(
            database_url=f"sqlite:///{tmp_path / 'src.db'}",
            blob_url=f"file://{tmp_path / 'blobs'}",
            spill_threshold_bytes=100,
        ),
        registry,
    )
    # the target shares the source's blob store, but where the blobs were not copied
    blobs = "elsewhere" if fault == "blobs not copied" else "blobs"
    target = create_engine(target_settings(blobs), registry)
    async with source as src, target as dst:
        run = await src.start(wf.id, {"text": "x" * 1000})  # input and a's output spill
        async with src.worker():
            await _until(src, run.id, RunStatus.SUSPENDED)
        snapshot = (await src.export_run(run.id)).model_dump(mode="json")
        bad = dict(snapshot)
        if fault == "renamed":
            bad["run_id"] = "edited" + uuid.uuid4().hex
        with pytest.raises(SpilledPayloadUnavailableError):
            await dst.import_run(bad)
        await _absent(dst, bad["run_id"])
        if fault == "blobs not copied":  # the operator copies them, and imports again
            for path in (tmp_path / "blobs").rglob("*"):
                if path.is_file():
                    copy = tmp_path / "elsewhere" / path.relative_to(tmp_path / "blobs")
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    copy.write_bytes(path.read_bytes())
        # the snapshot as exported imports, and the run goes on there
        info = await dst.import_run(snapshot)
        assert info.id == run.id
        async with dst.worker():
            await _until(dst, run.id, RunStatus.SUSPENDED)
            await dst.signal(run.id, "go", {"ok": True})
            done = await dst.wait(run.id, timeout=60)
    assert done.status == RunStatus.COMPLETED, done
    assert done.stage("a").output == {"echo": "x" * 1000}
    assert done.stage("b").output == {"got": {"ok": True}}
