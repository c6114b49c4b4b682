"""A worker that stops while a stage attempt outlasts ``shutdown_timeout`` cancels it and
gives its lease back; the only line an operator saw was the runner's "stage cancelled",
which reads as if the run had been cancelled. The worker now says what happened: how many
attempts it stopped and gave back, and that they run again on another worker."""

from __future__ import annotations

import asyncio
import logging

import pytest

from . import workflows as w
from .conftest import MakeEngine


async def test_a_shutdown_that_stops_attempts_says_their_leases_were_given_back(
    make_engine: MakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wfe.worker")
    engine = await make_engine(w.held, lease_seconds=30)
    w.BLOCK["slow"] = True
    try:
        run = await engine.start("it-held", {"n": 1})
        async with engine.worker(worker_id="leaving", shutdown_timeout=0.2) as host:
            await asyncio.wait_for(w.started("slow").wait(), 5)
        assert host.stats()["released"] == 1
    finally:
        w.BLOCK["slow"] = False
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "wfe.worker" and r.levelno == logging.INFO
    ]
    said = [m for m in lines if "leases back" in m]
    assert len(said) == 1, lines
    assert "worker leaving" in said[0] and "1 stage attempt(s)" in said[0]
    assert run.id in said[0] and "run again" in said[0]
