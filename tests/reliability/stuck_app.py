"""An app whose sync stage never returns, for the worker-exit test: ``wfe worker --app
tests.reliability.stuck_app:registry``. The stage writes ``$STUCK_DIR/entered`` and then
blocks its thread for good (a sync body cannot be interrupted)."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from engine_port import Registry, Retry, StageContext, Workflow


class StuckIn(BaseModel):
    pass


stuck = Workflow("stuck-sync", input=StuckIn, version="1")


@stuck.stage(timeout=timedelta(seconds=1), retry=Retry(max_attempts=1))
def hang(ctx: StageContext[StuckIn]) -> int:
    (Path(os.environ["STUCK_DIR"]) / f"entered-{ctx.attempt}").write_text(ctx.run_id)
    threading.Event().wait()  # never returns
    return 0


registry = Registry([stuck])
