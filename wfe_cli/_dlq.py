"""``wfe dlq list`` and ``wfe dlq replay``: events the sink refused too often."""

from __future__ import annotations

from typing import Annotated

import typer

from engine_port import Event, create_engine

from ._db import initialised
from ._errors import run_sync
from ._options import MAX_LIMIT, DriverOpt, JsonOpt, settings
from ._output import console, json_line, rows, when

__all__ = ["dlq_list", "dlq_replay"]


def dlq_list(
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_LIMIT, help="at most this many events")
    ] = 1000,
    driver: DriverOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Dead-lettered events, oldest first ('wfe dlq replay' queues them again)."""
    configured = settings(driver)
    initialised(configured)

    async def dead() -> list[Event]:
        async with create_engine(configured, None) as engine:
            return await engine.dead_letters(limit)

    found = run_sync(dead())
    if as_json:
        for e in found:
            json_line(e)
        return
    rows(
        ("event", "run", "seq", "type", "stage", "at"),
        [(e.id, e.run_id, str(e.seq), e.type, e.stage or "", when(e.at)) for e in found],
    )
    if console.is_terminal:
        console.print(f"{len(found)} dead-lettered event(s)")


def dlq_replay(driver: DriverOpt = None, as_json: JsonOpt = False) -> None:
    """Queue every dead-lettered event for delivery again."""
    configured = settings(driver)
    initialised(configured)

    async def replay() -> int:
        async with create_engine(configured, None) as engine:
            return await engine.replay_dlq()

    count = run_sync(replay())
    if as_json:
        json_line({"requeued": count})
    else:
        console.print(f"re-queued {count} dead-lettered event(s)")
