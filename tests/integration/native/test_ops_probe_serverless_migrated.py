"""``run_to_completion`` with the idempotency key of a run that was moved to another engine
answers as ``NativeEngine.start`` does: RunNotActiveError naming where the run went, not a
``migrated`` result the caller can neither wait on nor signal."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_native import run_to_completion
from driver_native._commands import CreateRun
from driver_native._engine import NativeEngine
from engine_port import (
    EngineSettings,
    Registry,
    RunStatus,
    StageContext,
    Workflow,
    create_engine,
    migrate_run,
)
from engine_port.errors import IdempotencyConflictError, RunNotActiveError

KEY = "order-7"


class Order(BaseModel):
    n: int


async def test_run_to_completion_repeat_of_a_moved_run_raises_run_not_active(
    tmp_path: Path,
) -> None:
    wf: Workflow[Order] = Workflow(f"ops-mig-{uuid.uuid4().hex[:8]}", input=Order, version="v1")

    @wf.stage
    async def a(ctx: StageContext[Order]) -> Any:
        return await ctx.step.wait_for_signal("go")

    registry = Registry([wf])
    blobs = f"file://{tmp_path / 'blobs'}"
    src_settings = EngineSettings(database_url=f"sqlite:///{tmp_path / 'src.db'}", blob_url=blobs)
    dst_settings = EngineSettings(database_url=f"sqlite:///{tmp_path / 'dst.db'}", blob_url=blobs)
    async with (
        create_engine(src_settings, registry) as src,
        create_engine(dst_settings, registry) as dst,
    ):
        assert isinstance(src, NativeEngine)
        first = await run_to_completion(src.kernel, CreateRun(wf.id, {"n": 1}, KEY))
        assert first.outcome == "suspended"
        assert (await migrate_run(src, dst, first.workflow_run_id)).outcome == "moved"
        deadline = time.monotonic() + 10
        while (await src.get_run(first.workflow_run_id)).status != RunStatus.MIGRATED:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)

        with pytest.raises(RunNotActiveError) as caught:
            await run_to_completion(src.kernel, CreateRun(wf.id, {"n": 1}, KEY))
        assert caught.value.migrated_to is not None
        assert caught.value.run_id == first.workflow_run_id
        # the same as the engine's own start with that key
        with pytest.raises(RunNotActiveError) as started:
            await src.start(wf.id, {"n": 1}, idempotency_key=KEY)
        assert str(caught.value) == str(started.value)
        assert caught.value.migrated_to == started.value.migrated_to
        # another input under the key is still a conflict, not a second run
        with pytest.raises(IdempotencyConflictError):
            await run_to_completion(src.kernel, CreateRun(wf.id, {"n": 2}, KEY))
