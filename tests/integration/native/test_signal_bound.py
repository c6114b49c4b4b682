"""Pending signals per run are bounded (issue 11, item 6): past ``max_pending_signals``
unconsumed signals, ``signal`` raises SignalQueueFullError and stores nothing; once the run
consumes one, signals are accepted again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from driver_native import NativeEngine, process_available_jobs
from engine_port import (
    EngineSettings,
    Registry,
    StageContext,
    Workflow,
    create_engine,
    migrate_runs,
)
from engine_port.errors import EngineError, SignalQueueFullError

from . import workflows as w
from .conftest import MakeEngine, count_rows


async def test_signals_past_the_bound_are_refused_with_a_typed_error(
    make_engine: MakeEngine,
) -> None:
    engine = await make_engine(w.waiter, max_pending_signals=3)
    run = await engine.start("it-waiter", {"n": 1})
    for i in range(3):
        await engine.signal(run.id, "junk", {"i": i})
    with pytest.raises(SignalQueueFullError) as caught:
        await engine.signal(run.id, "junk", {"i": 3})
    assert isinstance(caught.value, EngineError)
    assert "max_pending_signals" in str(caught.value)
    assert await count_rows(engine, "wfe_signal_queue", run_id=run.id) == 3  # nothing stored
    # a repeat of an accepted idempotency key still answers, it adds nothing
    other = await engine.start("it-waiter", {"n": 2})
    await engine.signal(other.id, "go", 1, idempotency_key="k")
    await engine.signal(other.id, "x", 2)
    await engine.signal(other.id, "y", 3)
    again = await engine.signal(other.id, "go", 1, idempotency_key="k")
    assert again.already_completed


twice = Workflow("it-twice", input=w.Item)


@twice.stage
async def two_waits(ctx: StageContext[w.Item]) -> list[Any]:
    first = await ctx.step.wait_for_signal("go")
    second = await ctx.step.wait_for_signal("go")
    return [first, second]


async def test_a_consumed_signal_frees_room_for_another(make_engine: MakeEngine) -> None:
    engine = await make_engine(twice, max_pending_signals=1)
    run = await engine.start("it-twice", {"n": 1})
    await engine.signal(run.id, "go", "first")
    with pytest.raises(SignalQueueFullError):
        await engine.signal(run.id, "go", "refused")
    await process_available_jobs(engine.kernel, 20)  # the first wait consumes "first"
    assert (await engine.get_run(run.id)).status == "suspended"
    await engine.signal(run.id, "go", "second")
    await process_available_jobs(engine.kernel, 20)
    info = await engine.get_run(run.id)
    assert info.status == "completed"
    assert info.output == ["first", "second"]


async def test_the_bound_is_the_runs_own_whatever_the_sender_is_configured_with(
    make_engine: MakeEngine,
) -> None:
    """The bound the run was created with (as on Temporal, whose run keeps it in its start
    document): a process configured with another bound neither refuses earlier nor accepts
    more, and SignalQueueFullError names the run's bound."""
    starter = await make_engine(w.waiter, max_pending_signals=2)
    sender = await make_engine(w.waiter, max_pending_signals=50)
    run = await starter.start("it-waiter", {"n": 1})
    for i in range(2):
        await sender.signal(run.id, "junk", {"i": i})
    with pytest.raises(SignalQueueFullError) as caught:
        await sender.signal(run.id, "junk", {"i": 2})
    assert caught.value.limit == 2
    roomy = await make_engine(w.waiter, max_pending_signals=50)
    other = await roomy.start("it-waiter", {"n": 2})
    for i in range(3):  # a stricter sender does not refuse what the run's bound allows
        await starter.signal(other.id, "junk", {"i": i})
    assert await count_rows(starter, "wfe_signal_queue", run_id=other.id) == 3


async def test_an_imported_run_takes_the_importing_engines_bound(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    """A run moved in keeps the bound of the engine that imported it, as a Temporal import
    starts the run with the importing engine's settings."""
    source = await make_engine(w.waiter, max_pending_signals=50)
    run = await source.start("it-waiter", {"n": 1})
    await process_available_jobs(source.kernel, 20)  # (parked on its wait)
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'target.db'}",
        blob_url=f"file://{tmp_path / 'blobs'}",
        max_pending_signals=2,
    )
    target = create_engine(settings, Registry([w.waiter]))
    roomy = settings.model_copy(update={"max_pending_signals": 50})
    sender = create_engine(roomy, Registry([w.waiter]))
    assert isinstance(target, NativeEngine) and isinstance(sender, NativeEngine)
    await target.connect()
    await sender.connect()
    try:
        await migrate_runs(source, target, run_ids=[run.id])
        for i in range(2):
            await sender.signal(run.id, "junk", {"i": i})
        with pytest.raises(SignalQueueFullError) as caught:
            await sender.signal(run.id, "junk", {"i": 2})
        assert caught.value.limit == 2
    finally:
        await sender.close()
        await target.close()
