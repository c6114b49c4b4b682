"""Input models and small workflows shared by the scenarios."""

from __future__ import annotations

from pydantic import BaseModel

from engine_port import StageContext, Workflow

__all__ = ["Num", "Order", "says_its_version"]


class Num(BaseModel):
    n: int = 0


class Order(BaseModel):
    order_id: str
    total: float


def says_its_version(workflow_id: str, version: str) -> Workflow[Num]:
    """One version of a one-stage workflow whose output is that version: which version ran."""
    wf = Workflow(workflow_id, input=Num, version=version)

    @wf.stage
    async def a(ctx: StageContext[Num]) -> str:
        return version

    return wf
