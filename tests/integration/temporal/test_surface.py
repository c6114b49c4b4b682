"""The driver's public surface is curated and carries no temporalio type."""

from __future__ import annotations

import inspect
import typing

import driver_temporal
from driver_temporal import TemporalEngine
from engine_port import WorkflowEngine


def test_public_surface_is_frozen() -> None:
    assert sorted(driver_temporal.__all__) == [
        "EngineWorker",
        "SEARCH_ATTRIBUTES",
        "TemporalDevServer",
        "TemporalEngine",
        "create_temporal_engine",
        "find_temporal_binary",
        "run_dev_server",
        "run_worker_forever",
    ]


def test_engine_api_mentions_no_temporalio_type() -> None:
    for name, fn in inspect.getmembers(TemporalEngine, inspect.isfunction):
        if name.startswith("_") or not hasattr(WorkflowEngine, name):
            continue
        hints = typing.get_type_hints(fn)
        for hint in hints.values():
            assert "temporalio" not in repr(hint), (name, hint)
    public = [n for n in vars(TemporalEngine) if not n.startswith("_")]
    assert "client" not in public
