"""``max_payload_bytes`` (issue 11, item 6): a run input, signal payload, step result or stage
output above the limit is refused with an InvalidInputError (PayloadTooLargeError) naming the
size and the limit, before anything is written; an oversized result fails the stage at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from driver_native import process_available_jobs
from engine_port import Retry, StageContext, Workflow
from engine_port.errors import InvalidInputError, PayloadTooLargeError

from .conftest import MakeEngine, count_rows

LIMIT = 2_000


class Text(BaseModel):
    text: str = ""
    size: int = 0


wf = Workflow("it-sized", input=Text)


@wf.stage(retry=Retry(max_attempts=3))
async def produce(ctx: StageContext[Text]) -> Any:
    if ctx.input.text == "step":
        await ctx.step.run("big", lambda: "s" * ctx.input.size)
    if ctx.input.text == "wait":
        return await ctx.step.wait_for_signal("go")
    return "o" * ctx.input.size


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


async def test_an_oversized_input_or_signal_is_refused_before_anything_is_written(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    root = tmp_path / "sized-blobs"
    engine = await make_engine(wf, blob_url=f"file://{root}", max_payload_bytes=LIMIT)
    with pytest.raises(InvalidInputError) as caught:
        await engine.start("it-sized", {"text": "x" * 5_000})
    assert isinstance(caught.value, PayloadTooLargeError)
    message = str(caught.value)
    assert "max_payload_bytes" in message and "2,000" in message and "5,0" in message
    assert await count_rows(engine, "wfe_runs") == 0
    assert _files(root) == []

    run = await engine.start("it-sized", {"text": "wait"})
    await process_available_jobs(engine.kernel, 10)
    with pytest.raises(PayloadTooLargeError, match="payload of signal 'go'"):
        await engine.signal(run.id, "go", "p" * 5_000)
    assert await count_rows(engine, "wfe_signal_queue", run_id=run.id) == 0
    await engine.signal(run.id, "go", "small")  # under the limit: accepted
    await process_available_jobs(engine.kernel, 10)
    assert (await engine.get_run(run.id)).output == "small"


@pytest.mark.parametrize("what", ["step", "output"])
async def test_an_oversized_step_result_or_output_fails_the_stage_without_retries(
    make_engine: MakeEngine, tmp_path: Path, what: str
) -> None:
    root = tmp_path / "sized-blobs"
    engine = await make_engine(wf, blob_url=f"file://{root}", max_payload_bytes=LIMIT)
    run = await engine.start("it-sized", {"text": what, "size": 5_000})
    await process_available_jobs(engine.kernel, 20)
    info = await engine.get_run(run.id)
    assert info.status == "failed"
    assert info.error is not None and info.error.type == "PayloadTooLargeError"
    assert "max_payload_bytes" in info.error.message
    assert info.stage("produce").attempt == 1  # not retried: a retry cannot shrink it
    assert await count_rows(engine, "wfe_steps", run_id=run.id) == 0
    assert _files(root) == []
