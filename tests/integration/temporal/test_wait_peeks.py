"""``wait()`` on a run whose execution closes when it ends asks Temporal nothing while it waits
but the close long poll: no describe of its status every few hundred milliseconds.

How it went wrong: ``wait()`` peeked at the run's status (a describe) from 0.25 s on, at
doubling intervals, in case the run ended while its execution stayed open to deliver its last
events (runs started before their last events became the worker's to deliver). Every run
started since is closed by the workflow task that ends it, so the peeks found nothing; in the
bench's throughput workload (1,000 runs waited on 100 at a time) they were 2.4 describes a
run the hand-written workflow does not make, each a persistence read and namespace lookups of
the dev server, whose CPU bounds that workload.

Now a run this engine started with ``StartDocument.ends_on_worker`` is waited on by the close
poll alone; a run another engine started is peeked at once, which tells it too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import Registry, StageContext, Workflow

from .conftest import EngineFactory

pytestmark = pytest.mark.temporal


class In(BaseModel):
    n: int = 0


def _slow(gate: asyncio.Event) -> Workflow:
    wf = Workflow("wait-peeks", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        await gate.wait()
        return 1

    return wf


def _count_describes(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = engine._describe_raw

    async def counted(run_id: str) -> Any:
        calls.append(run_id)
        return await real(run_id)

    monkeypatch.setattr(engine, "_describe_raw", counted)
    return calls


async def _waited(engine: Any, run_id: str, gate: asyncio.Event) -> Any:
    """wait() on the run for 1.6 s of its stage (past the peeks at 0.25 and 0.75 s), then let
    it end."""
    waiting = asyncio.ensure_future(engine.wait(run_id, timeout=60))
    await asyncio.sleep(1.6)
    assert not waiting.done(), waiting
    gate.set()
    return await waiting


async def test_wait_on_a_run_started_here_makes_no_describe(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()
    engine = make_engine(Registry([_slow(gate)]))
    async with engine, engine.worker():
        run = await engine.start("wait-peeks", {})
        calls = _count_describes(engine, monkeypatch)
        info = await _waited(engine, run.id, gate)
    assert info.status == "completed" and info.output == 1, info
    # before: 2 (the peeks at 0.25 and 0.75 s)
    assert calls == [], calls


async def test_wait_on_a_run_another_engine_started_peeks_once(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()
    wf = _slow(gate)
    starter, waiter = make_engine(Registry([wf])), make_engine(Registry([wf]))
    async with starter, waiter, starter.worker():
        run = await starter.start("wait-peeks", {})
        calls = _count_describes(waiter, monkeypatch)
        info = await _waited(waiter, run.id, gate)
    assert info.status == "completed" and info.output == 1, info
    # the first peek reads from the run's start memo that its execution closes as it ends
    # (before: 2)
    assert calls == [run.id], calls
