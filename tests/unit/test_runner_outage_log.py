"""An outage of the engine's storage (a blob store down, a full disk) lets the same jobs be
claimed and abandoned every couple of seconds for as long as it lasts: the StageRunner logs one
WARNING for the outage (the rest at DEBUG) and one INFO once an attempt goes through again,
with how many were abandoned. The count is the runner's own (the Temporal driver's activities
use the same StageRunner), never global."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel

from engine_port import (
    Abandoned,
    Completed,
    FakeClock,
    InMemoryLedger,
    Registry,
    StageContext,
    StageRequest,
    StageRunner,
    StepRecord,
    Workflow,
)

RUNNER_LOGGERS = ("wfe.stage", "wfe.runner")


class In(BaseModel):
    n: int = 0


class OutageLedger(InMemoryLedger):
    """Every write raises while ``down`` (a blob folder made unwritable, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def put(self, record: StepRecord) -> None:
        if self.down:
            raise OSError(28, "No space left on device")
        await super().put(record)


def _workflow() -> Workflow[In]:
    wf = Workflow("outage-log", input=In)

    @wf.stage
    async def s(ctx: StageContext[In]) -> str:
        return str(await ctx.step.run("one", lambda: "one"))

    @s.compensation
    async def undo(ctx: StageContext[In], output: str) -> None:
        await ctx.step.run("undo", lambda: "undone")

    return wf


def _request(wf: Workflow[In], run_id: str = "r1") -> StageRequest:
    return StageRequest(run_id=run_id, workflow=wf, stage_id="s", attempt=1, input={})


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name in RUNNER_LOGGERS and r.levelno == level and "abandon" in r.getMessage()
    ]


async def test_an_outage_is_one_warning_and_one_info_when_it_is_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wf = _workflow()
    runner = StageRunner(Registry([wf]), FakeClock())
    ledger = OutageLedger()
    for n in range(4):
        assert isinstance(await runner.run(_request(wf, f"r{n}"), ledger), Abandoned)
    # a compensation abandoned in the same outage is one more of its attempts
    assert isinstance(await runner.compensate(_request(wf), "one", ledger), Abandoned)
    warned = [
        r for r in caplog.records if r.name in RUNNER_LOGGERS and r.levelno >= logging.WARNING
    ]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "stage abandoned: the engine's storage failed" in warned[0].getMessage()
    assert "further attempts abandoned until one goes through" in warned[0].getMessage()
    assert len(_records(caplog, logging.DEBUG)) == 4  # the others: still there, at DEBUG
    assert _records(caplog, logging.INFO) == []  # not over yet

    ledger.down = False
    assert await runner.run(_request(wf), ledger) == Completed("one")
    back = _records(caplog, logging.INFO)
    assert len(back) == 1 and back[0].endswith(
        "the engine's storage answers again: 5 attempt(s) were abandoned meanwhile"
    ), back
    assert await runner.run(_request(wf), ledger) == Completed("one")
    assert len(_records(caplog, logging.INFO)) == 1  # said once

    # the next outage warns again
    ledger.down = True
    assert isinstance(await runner.run(_request(wf, "r9"), OutageLedger()), Abandoned)
    warned = [
        r for r in caplog.records if r.name in RUNNER_LOGGERS and r.levelno >= logging.WARNING
    ]
    assert len(warned) == 2


async def test_each_runner_counts_its_own_outage(caplog: pytest.LogCaptureFixture) -> None:
    """Two engines in one process (two runners): no state shared between them."""
    caplog.set_level(logging.DEBUG)
    wf = _workflow()
    one, two = StageRunner(Registry([wf]), FakeClock()), StageRunner(Registry([wf]), FakeClock())
    for runner in (one, two, one):
        assert isinstance(await runner.run(_request(wf), OutageLedger()), Abandoned)
    assert len(_records(caplog, logging.WARNING)) == 2
    assert (one.abandoned.count, two.abandoned.count) == (2, 1)
    assert await two.run(_request(wf), InMemoryLedger()) == Completed("one")
    assert (one.abandoned.count, two.abandoned.count) == (2, 0)
    assert _records(caplog, logging.INFO)[-1].endswith("1 attempt(s) were abandoned meanwhile")


async def test_a_run_that_needs_nothing_of_the_failing_store_does_not_end_the_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run with no spilled value goes through while the blob store is down: ending the
    outage on it logged the INFO, then the next abandoned attempt a WARNING again, over and
    over for as long as the outage lasted."""
    caplog.set_level(logging.DEBUG)
    wf = _workflow()
    runner = StageRunner(Registry([wf]), FakeClock())
    down = OutageLedger()
    for _ in range(3):
        assert isinstance(await runner.run(_request(wf, "stuck"), down), Abandoned)
        assert await runner.run(_request(wf, "unaffected"), InMemoryLedger()) == Completed("one")
    assert len(_records(caplog, logging.WARNING)) == 1
    assert _records(caplog, logging.INFO) == []
    down.down = False
    assert await runner.run(_request(wf, "stuck"), down) == Completed("one")
    assert _records(caplog, logging.INFO)[-1].endswith("3 attempt(s) were abandoned meanwhile")


async def test_an_outage_ends_once_it_was_quiet_for_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The abandoned job may have gone to another host: any attempt that goes through once
    nothing was abandoned for ``quiet_s`` ends the outage here."""
    caplog.set_level(logging.DEBUG)
    wf = _workflow()
    runner = StageRunner(Registry([wf]), FakeClock())
    runner.abandoned.quiet_s = 0.0
    assert isinstance(await runner.run(_request(wf, "moved-away"), OutageLedger()), Abandoned)
    assert await runner.run(_request(wf, "other"), InMemoryLedger()) == Completed("one")
    assert _records(caplog, logging.INFO)[-1].endswith("1 attempt(s) were abandoned meanwhile")
