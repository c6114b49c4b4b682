"""The takeover application (BlindSpotContract): stage ``b`` records ``ctx.attempt`` and blocks
on its first execution, so the test can kill its worker there; the attempt another worker takes
over must still be attempt 1. Configured by WFE_CONFORMANCE_WF and WFE_CONFORMANCE_LOG."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from engine_port import Registry, StageContext, Workflow

from .._harness import ExecutionLog
from .._models import Num

__all__ = ["build", "registry"]


def build(workflow_id: str, log_path: str) -> Registry:
    log = ExecutionLog(Path(log_path))
    wf = Workflow(workflow_id, input=Num, version="takeover-v1")

    @wf.stage
    async def b(ctx: StageContext[Num]) -> int:
        log.hit(f"b-attempt-{ctx.attempt}")
        if log.count("b-attempt-1") + log.count("b-attempt-2") == 1:
            await asyncio.sleep(3600)  # the test kills this worker here
        return ctx.attempt

    return Registry([wf])


def registry() -> Registry:
    """Entry point for ``wfe worker --app conformance.apps.takeover:registry``."""
    return build(os.environ["WFE_CONFORMANCE_WF"], os.environ["WFE_CONFORMANCE_LOG"])
