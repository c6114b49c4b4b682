"""A large value's hash and decoding run off the event loop, under the attempt's heartbeats.

Seen beside a CPU hog (load ~6 on 2 vCPUs): a stage whose step returned 1 MB and whose output
was 10 MB held its worker's event loop for over a second per large value (the claim check's
sha256 and JSON decoding, on top of the encoding), and no heartbeat of the worker's leases got
through meanwhile. On a busier host or with a larger value that is longer than the lease: the
job is taken over and the steps it had not journaled yet run a second time. Structure, not
timing: every large hash and decode of a run is made on a worker thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import RunStatus, StageContext, Workflow, _blobs

from .conftest import MakeEngine


class In(BaseModel):
    n: int = 0


async def test_large_step_results_and_outputs_are_hashed_and_decoded_off_the_loop(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    large: list[tuple[str, bool]] = []  # (what, on the event loop's thread)
    digest, decode = _blobs._digest, _blobs.loads

    def noting_digest(data: bytes) -> str:
        if len(data) >= _blobs.OFF_LOOP_BYTES:
            large.append(("sha256", threading.get_ident() == loop_thread))
        return digest(data)

    def noting_loads(data: bytes | str) -> Any:
        if len(data) >= _blobs.OFF_LOOP_BYTES:
            large.append(("decode", threading.get_ident() == loop_thread))
        return decode(data)

    monkeypatch.setattr(_blobs, "_digest", noting_digest)
    monkeypatch.setattr(_blobs, "loads", noting_loads)

    ran: Counter[str] = Counter()
    size = 2 * _blobs.OFF_LOOP_BYTES
    wf = Workflow("large-values-off-loop", input=In)

    def make() -> str:
        ran["make"] += 1
        return "s" * size

    @wf.stage
    async def big(ctx: StageContext[In]) -> dict[str, str]:
        step = await ctx.step.run("make", make)
        # (suspends: the attempt that resumes reads the step's spilled result back)
        await ctx.step.sleep("replay", timedelta(milliseconds=50))
        return {"blob": "b" * size, "step": step[:10]}

    @wf.stage(after=[big])
    async def measure(ctx: StageContext[In]) -> int:
        return len(ctx.output_of(big)["blob"])

    engine = await make_engine(wf)
    async with engine.worker(poll_interval=0.02):
        run = await engine.start(wf.id, {})
        info = await engine.wait(run.id, timeout=60)
    assert info.status == RunStatus.COMPLETED, info.error
    assert info.output == size
    assert ran == {"make": 1}
    # the step's result stored and read back on replay, the output stored and read by the
    # next stage (and by ``wait``'s answer): each hashed or decoded on a worker thread
    kinds = Counter(what for what, _ in large)
    assert kinds["sha256"] == 2 and kinds["decode"] >= 2, large
    assert [what for what, on_loop in large if on_loop] == []
