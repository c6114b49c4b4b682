"""The Temporal driver applies ``max_payload_bytes`` like the native one (issue 11, item 6):
an oversized input or signal payload is refused before anything reaches the server, and an
oversized stage output fails the stage at once."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine
from engine_port.errors import PayloadTooLargeError

pytestmark = pytest.mark.temporal


class Text(BaseModel):
    text: str = ""
    size: int = 0


async def test_temporal_refuses_oversized_values(temporal_server: Any, tmp_path: Path) -> None:
    wf = Workflow(f"sized-{uuid.uuid4().hex[:6]}", input=Text)

    @wf.stage(retry=Retry(max_attempts=3))
    async def produce(ctx: StageContext[Text]) -> Any:
        if ctx.input.text == "wait":
            return await ctx.step.wait_for_signal("go")
        if ctx.input.text == "emit":
            ctx.emit("big", {"blob": "e" * ctx.input.size})
            return None
        return "o" * ctx.input.size

    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_server.address,
        task_queue=f"lim-{uuid.uuid4().hex[:8]}",
        blob_url=f"file://{tmp_path / 'blobs'}",
        max_payload_bytes=2_000,
    )
    async with create_engine(settings, Registry([wf])) as engine, engine.worker():
        with pytest.raises(PayloadTooLargeError, match="max_payload_bytes"):
            await engine.start(wf.id, {"text": "x" * 5_000})
        assert await engine.list_runs(workflow_id=wf.id) == []

        run = await engine.start(wf.id, {"text": "wait"})
        with pytest.raises(PayloadTooLargeError, match="payload of signal 'go'"):
            await engine.signal(run.id, "go", "p" * 5_000)
        await engine.signal(run.id, "go", "small")
        assert (await engine.wait(run.id, timeout=60)).output == "small"

        big = await engine.start(wf.id, {"size": 5_000})
        info = await engine.wait(big.id, timeout=60)
        assert info.status == "failed"
        assert info.error is not None and info.error.type == "PayloadTooLargeError"
        assert info.stage("produce").attempt == 1

        # a stage's events ride inline in its activity's result: past Temporal's 2 MB payload
        # limit the server refused that result and the run stayed running for ever; now the
        # attempt fails, not retried (max_payload_bytes is not what bounds them here)
        loud = await engine.start(wf.id, {"text": "emit", "size": 2_500_000})
        info = await engine.wait(loud.id, timeout=60)
        assert info.status == "failed"
        assert info.error is not None and info.error.type == "PayloadTooLargeError"
        assert "events" in info.error.message and "Temporal" in info.error.message
        assert info.stage("produce").attempt == 1
