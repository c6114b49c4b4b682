"""Paging through the runs list from outside, as a dashboard does (``list_runs_page``): bad
cursors and limits get a typed answer at once, never a 10 s wait for DriverUnavailableError
or a raw ValueError."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest

from engine_port import RunStatus
from engine_port.errors import InvalidInputError
from wfe_cli._demo import build_demo

from .conftest import EngineFactory


async def test_page_cursors_are_checked_before_temporal_sees_them(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(build_demo())
    await engine.connect()
    made = [
        await engine.start("demo-order", {"order_id": f"L-{i}", "total": 1.0}) for i in range(5)
    ]
    for _ in range(100):  # (visibility catches up a moment later)
        if len(await engine.list_runs(outputs=False)) == 5:
            break
        await asyncio.sleep(0.1)
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = await engine.list_runs_page(limit=2, after=cursor, outputs=False)
        seen += [r.id for r in page]
        if cursor is None:
            break
    assert sorted(seen) == sorted(r.id for r in made)
    _, good = await engine.list_runs_page(limit=2, outputs=False)
    _, pending_first = await engine.list_runs_page(
        limit=1, status=[RunStatus.PENDING], outputs=False
    )
    assert good is not None and pending_first is not None
    forged = [
        "garbage",  # (base64 that decodes to bytes Temporal cannot read)
        "1796490533.605143~18258fdfe692",  # the native driver's
        good[:-3],
        good[:10] + ("A" if good[10] != "A" else "B") + good[11:],
        base64.urlsafe_b64encode(b'{"CloseTime":"x"}').decode(),
        "",
    ]
    for bad in forged:
        t = time.monotonic()
        with pytest.raises(InvalidInputError, match="not a page cursor"):
            await engine.list_runs_page(limit=2, after=bad)
        assert time.monotonic() - t < 2
    with pytest.raises(InvalidInputError, match="same filters"):
        await engine.list_runs_page(limit=2, after=pending_first, workflow_id="demo-order")


async def test_huge_limits_and_a_nul_prefix(make_engine: EngineFactory) -> None:
    engine = make_engine(build_demo())
    await engine.connect()
    await engine.start("demo-order", {"order_id": "H-1", "total": 1.0})
    for limit in (2**31, 2**63):  # (ValueError: Value out of range, from protobuf)
        page, _ = await engine.list_runs_page(limit=limit, outputs=False)
        assert len(page) <= 1
        assert len(await engine.list_runs(limit=limit, outputs=False)) <= 1
    t = time.monotonic()  # (DriverUnavailableError after 10 s: "SQL logic error")
    with pytest.raises(InvalidInputError, match="NUL"):
        await engine.list_runs_page(id_prefix="a\x00")
    assert time.monotonic() - t < 2
