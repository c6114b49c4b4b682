"""The StageRunner tells a fault of the engine's storage (the ledger, the blob store behind it)
from an error of the stage's own code: the first abandons the attempt (``Abandoned``), only the
second fails it (DESIGN §5)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    Abandoned,
    Completed,
    Failed,
    FakeClock,
    InMemoryLedger,
    Registry,
    Retry,
    StageContext,
    StageRequest,
    StageRunner,
    StepRecord,
    Workflow,
)
from engine_port.errors import DriverUnavailableError, SpilledPayloadUnavailableError

SECRET = "4111-1111-1111-1111"


class In(BaseModel):
    n: int = 0


class FailingLedger(InMemoryLedger):
    """Its ``fail_on``-th write (1-based) raises ``exc`` instead of writing."""

    def __init__(self, exc: Exception, fail_on: int = 1) -> None:
        super().__init__()
        self.exc = exc
        self.fail_on = fail_on
        self.writes = 0

    async def put(self, record: StepRecord) -> None:
        self.writes += 1
        if self.writes == self.fail_on:
            raise self.exc
        await super().put(record)


RAN: Counter[str] = Counter()


def _workflow(kind: str) -> Workflow[In]:
    wf = Workflow(f"faults-{kind}", input=In)

    def one() -> str:
        RAN["one"] += 1
        return SECRET

    if kind == "plain":

        @wf.stage(retry=Retry(max_attempts=3))
        async def s(ctx: StageContext[In]) -> str:
            return str(await ctx.step.run("one", one))

    elif kind == "catches":

        @wf.stage(retry=Retry(max_attempts=3))
        async def s(ctx: StageContext[In]) -> str:
            try:
                return str(await ctx.step.run("one", one))
            except Exception:
                return "caught"

    elif kind == "sync":

        @wf.stage(retry=Retry(max_attempts=3))
        def s(ctx: StageContext[In]) -> str:
            return str(ctx.sync_step.run("one", one))

    elif kind == "user-db-error":

        @wf.stage(retry=Retry(max_attempts=3))
        async def s(ctx: StageContext[In]) -> str:
            def query() -> str:
                raise ConnectionError("the user's own service is down")

            return str(await ctx.step.run("one", query))

    return wf


async def _run(wf: Workflow[In], ledger: InMemoryLedger) -> Any:
    runner = StageRunner(Registry([wf]), FakeClock())
    req = StageRequest(run_id="r1", workflow=wf, stage_id="s", attempt=1, input={})
    return await runner.run(req, ledger)


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


@pytest.mark.parametrize("kind", ["plain", "catches", "sync"])
@pytest.mark.parametrize(
    "exc",
    [
        OSError("connection reset by peer"),
        DriverUnavailableError("cannot reach the database"),
    ],
    ids=["oserror", "unavailable"],
)
async def test_a_journaling_fault_abandons_the_attempt(kind: str, exc: Exception) -> None:
    """Even a body that catches ``Exception`` around the step cannot turn the fault into its
    own result; nothing of the step's result goes into the outcome."""
    ledger = FailingLedger(exc)
    outcome = await _run(_workflow(kind), ledger)
    assert isinstance(outcome, Abandoned), outcome
    assert "journaling step 'one'" in outcome.reason
    assert SECRET not in outcome.reason
    assert ledger.records == {}


async def test_a_retry_after_the_fault_replays_what_was_journaled() -> None:
    wf = _workflow("plain")
    ledger = FailingLedger(OSError("dropped"))
    assert isinstance(await _run(wf, ledger), Abandoned)
    outcome = await _run(wf, ledger)
    assert outcome == Completed(SECRET)
    assert await _run(wf, ledger) == Completed(SECRET)
    assert RAN["one"] == 2  # ran again once: its first result was never journaled


async def test_the_stage_code_own_errors_still_fail_the_attempt() -> None:
    """An exception raised by a step function is the user's, whatever its type."""
    outcome = await _run(_workflow("user-db-error"), InMemoryLedger())
    assert isinstance(outcome, Failed) and outcome.retryable
    assert outcome.error.type == "ConnectionError"


async def test_an_engine_error_of_the_ledger_is_not_a_storage_fault() -> None:
    """A user-caused error (a blob the configured store lacks) keeps failing the attempt."""
    ledger = FailingLedger(SpilledPayloadUnavailableError("runs/r1/x"))
    outcome = await _run(_workflow("plain"), ledger)
    assert isinstance(outcome, Failed)
    assert outcome.error.type == "SpilledPayloadUnavailableError"
    assert not outcome.retryable  # the blob does not come back by itself


async def test_a_compensation_journaling_fault_is_abandoned_too() -> None:
    wf = Workflow("faults-comp", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> str:
        return "done"

    @s.compensation
    async def undo(ctx: StageContext[In], output: str) -> None:
        await ctx.step.run("undo", lambda: "undone")

    runner = StageRunner(Registry([wf]), FakeClock())
    req = StageRequest(run_id="r1", workflow=wf, stage_id="s", attempt=1, input={})
    outcome = await runner.compensate(req, "done", FailingLedger(OSError("dropped")))
    assert isinstance(outcome, Abandoned)


@pytest.mark.parametrize(
    "exc", [ValueError("value too long for type character varying(200)"), KeyError("x")]
)
async def test_a_permanent_error_of_the_ledger_fails_the_attempt(exc: Exception) -> None:
    """A data or programming error (nothing a later try could fix) is not abandoned, which
    would re-run the stage for ever: it fails the attempt and uses up a retry."""
    outcome = await _run(_workflow("plain"), FailingLedger(exc))
    assert isinstance(outcome, Failed)


async def test_a_dbapi_operational_error_is_a_storage_fault() -> None:
    class OperationalError(Exception):  # the PEP 249 name every database driver uses
        pass

    outcome = await _run(_workflow("plain"), FailingLedger(OperationalError("server gone")))
    assert isinstance(outcome, Abandoned)


async def test_a_stage_timeout_during_a_slow_ledger_write_abandons_the_attempt() -> None:
    """The stage's time ran out while the engine's storage was journaling (a database
    reconnecting): the attempt is abandoned, not failed with StageTimeoutError."""
    import asyncio
    from datetime import timedelta

    class SlowLedger(InMemoryLedger):
        async def put(self, record: StepRecord) -> None:
            await asyncio.sleep(30)  # cancelled by the stage timeout

    wf = Workflow("faults-slow", input=In)

    @wf.stage(timeout=timedelta(seconds=0.05), retry=Retry(max_attempts=1))
    async def s(ctx: StageContext[In]) -> str:
        return str(await ctx.step.run("one", lambda: "one"))

    outcome = await _run(wf, SlowLedger())
    assert isinstance(outcome, Abandoned)


async def test_a_stage_timeout_in_the_stage_code_still_fails_it() -> None:
    import asyncio
    from datetime import timedelta

    wf = Workflow("faults-slow-body", input=In)

    @wf.stage(timeout=timedelta(seconds=0.05), retry=Retry(max_attempts=1))
    async def s(ctx: StageContext[In]) -> str:
        async def slow() -> str:
            await asyncio.sleep(30)
            return "late"

        return str(await ctx.step.run("one", slow))

    outcome = await _run(wf, InMemoryLedger())
    assert isinstance(outcome, Failed) and outcome.error.type == "StageTimeoutError"
