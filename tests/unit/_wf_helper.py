"""A workflow defined in a module of its own, so that a subprocess with another
PYTHONHASHSEED can build exactly the same definition (see test_graph.py)."""

from __future__ import annotations

from datetime import timedelta
from enum import Enum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from engine_port import NonRetryableError, Retry, Workflow

if TYPE_CHECKING:  # only for the type checker: the return annotations must still resolve
    from engine_port import StageContext


class Colour(Enum):
    RED = "red"
    GREEN = "green"


class HelperIn(BaseModel):
    order_id: str
    tags: set[str] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
    flags: frozenset[str] = frozenset({"x", "y", "z", "w"})
    colour: Colour = Colour.RED
    mode: Literal["fast", "slow"] = "fast"
    extra: dict[str, int] = {"one": 1, "two": 2}


class HelperOut(BaseModel):
    ids: list[str]
    total: float


class Boom(Exception):
    pass


class Bang(Exception):
    pass


helper_wf: Workflow[HelperIn] = Workflow("helper-wf", input=HelperIn, hooks=["h2", "h1"])


@helper_wf.stage(
    retry=Retry(
        max_attempts=4,
        initial_interval=timedelta(seconds=2),
        backoff=3.0,
        non_retryable=(Boom, Bang, NonRetryableError),
    ),
    timeout=timedelta(minutes=1),
)
async def first(ctx: StageContext[HelperIn]) -> HelperOut:
    return HelperOut(ids=[ctx.input.order_id], total=1.0)


@helper_wf.stage(after=[first])
async def second(ctx: StageContext[HelperIn]) -> dict[str, int]:
    return {"n": 1}


@helper_wf.stage(after=[first])
async def third(ctx: StageContext[HelperIn]) -> set[str]:
    return {"a"}


@helper_wf.stage(after=[second, third])
def fourth(ctx: StageContext[HelperIn]) -> None:
    return None


if __name__ == "__main__":
    print(helper_wf.version)
