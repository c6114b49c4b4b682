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
        if ctx.input.text == "emit":  # events each under max_payload_bytes, together over 2 MB
            for _ in range(ctx.input.size // 1_500 + 1):
                ctx.emit("big", {"blob": "e" * 1_500})
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
        # attempt fails, not retried (each event is within max_payload_bytes: their sum is
        # what Temporal cannot carry)
        loud = await engine.start(wf.id, {"text": "emit", "size": 2_500_000})
        info = await engine.wait(loud.id, timeout=60)
        assert info.status == "failed"
        assert info.error is not None and info.error.type == "PayloadTooLargeError"
        assert "events" in info.error.message and "Temporal" in info.error.message
        assert info.stage("produce").attempt == 1


async def test_temporal_fan_out_of_sizeable_values_completes(
    temporal_server: Any, tmp_path: Path
) -> None:
    """Each value under the spill threshold rides inline, but a 1 -> 80 fan-out of a 60 KB
    output scheduled 4.8 MB of activity inputs in one workflow task (Temporal terminated the
    run: GrpcMessageTooLarge), the join's input carried 80 such outputs (over 2 MiB) and the
    run's memo showed them all (the last workflow task failed for ever). The native driver
    completes it; so does this one now, the values past the budget in the blob store."""
    wf = Workflow(f"wide-values-{uuid.uuid4().hex[:6]}", input=Text)
    width, size = 80, 60_000

    @wf.stage
    async def root(ctx: StageContext[Text]) -> str:
        return "r" * size

    middles = []
    for i in range(width):

        async def middle(ctx: StageContext[Text]) -> str:
            return str(ctx.output_of("root"))[:1] + "o" * (size - 1)

        middle.__name__ = f"m{i}"
        middles.append(wf.stage(id=f"m{i}", after=[root])(middle))

    @wf.stage(after=middles)
    async def join(ctx: StageContext[Text]) -> int:
        return sum(len(str(ctx.output_of(m))) for m in middles)

    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_server.address,
        task_queue=f"lim-{uuid.uuid4().hex[:8]}",
        blob_url=f"file://{tmp_path / 'blobs'}",
    )
    async with create_engine(settings, Registry([wf])) as engine, engine.worker():
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=120)
        assert info.status == "completed", info.error
        assert info.output == width * size
        got = await engine.get_run(run.id)
        assert got.stage("m7").output == "r" + "o" * (size - 1)
        assert got.stage("root").output == "r" * size
