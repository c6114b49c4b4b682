"""A wide run draws no memo-size warning: temporalio's SDK core logs TMPRL1103 to the
process's stderr for each memo over 2 KiB it sends, and a 52-stage run's ``wfe_run`` memo is
~2 KiB at its start and ~8 KiB at its end, by design (the driver warns past 32 KiB:
``_rpc.PAYLOAD_LIMITS``). Run in a child process: the core writes to the stderr it found."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from tests.support.scripts import start_script

pytestmark = pytest.mark.temporal

_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from pydantic import BaseModel
    from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine

    class In(BaseModel):
        n: int = 0

    wide = Workflow("memo-wide", input=In)

    @wide.stage
    async def head(ctx: StageContext[In]) -> int:
        return 0

    async def leaf(ctx: StageContext[In]) -> int:
        return 1

    leaves = [wide.stage(leaf, id=f"leaf{i:02d}", after=[head]) for i in range(50)]

    @wide.stage(after=leaves)
    async def join(ctx: StageContext[In]) -> int:
        return len(ctx.outputs)

    async def main() -> None:
        settings = EngineSettings(
            driver="temporal", temporal_address=sys.argv[1], task_queue=sys.argv[3],
            blob_url="file://" + sys.argv[2],
        )
        async with create_engine(settings, Registry([wide])) as engine, engine.worker():
            run = await engine.start("memo-wide", {})
            info = await engine.wait(run.id, timeout=60)
            print(info.status, len(info.stages))

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


async def test_a_52_stage_run_draws_no_memo_size_warning(
    temporal_address: str, blob_dir: Path, tmp_path: Path
) -> None:
    script = tmp_path / "wide.py"
    script.write_text(_SCRIPT)
    proc = await start_script(
        script, temporal_address, str(blob_dir), "memo-warning", stdout=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err[-2000:]
    assert out.decode().split() == ["completed", "52"]
    assert b"TMPRL1103" not in err, err[-2000:]
