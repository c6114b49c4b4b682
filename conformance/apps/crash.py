"""The S17 application: stage b blocks after step x on its first execution, so that the test
can kill its worker process there. Configured by WFE_CONFORMANCE_WF and WFE_CONFORMANCE_LOG."""

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
    wf = Workflow(workflow_id, input=Num, version="crash-v1")

    def x() -> str:
        log.hit("x")
        return "x"

    def y() -> str:
        log.hit("y")
        return "y"

    @wf.stage
    async def a(ctx: StageContext[Num]) -> str:
        log.hit("a")
        return "a"

    @wf.stage(after=[a])
    async def b(ctx: StageContext[Num]) -> str:
        log.hit("b")
        await ctx.step.run("x", x)
        log.hit("b-between")
        if log.count("b-between") == 1:
            await asyncio.sleep(3600)  # the test kills this worker here
        await ctx.step.run("y", y)
        return "b"

    @wf.stage(after=[b])
    async def c(ctx: StageContext[Num]) -> str:
        log.hit("c")
        return "c"

    return Registry([wf])


def registry() -> Registry:
    """Entry point for ``wfe worker --app conformance.apps.crash:registry``."""
    return build(os.environ["WFE_CONFORMANCE_WF"], os.environ["WFE_CONFORMANCE_LOG"])
