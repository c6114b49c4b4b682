"""The benchmark harness must not rot: every workload once, at tiny size, for the native
driver on SQLite and the raw floor (and DBOS on SQLite when dbos is installed). This checks
that numbers come out, never how big they are: benchmarks are not timed assertions."""

from __future__ import annotations

import importlib.util
import math

import pytest

from bench._common import WORKLOADS
from bench._systems import run_one

SYSTEMS = [
    "native-sqlite",
    "floor-sqlite",
    pytest.param(
        "dbos-sqlite",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("dbos") is None,
            reason="dbos is not installed (pip install 'wfe[bench]')",
        ),
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("system", SYSTEMS)
def test_every_workload_produces_numbers(system: str) -> None:
    result = run_one(system, quick=True)
    assert set(result) == set(WORKLOADS)
    for workload, cell in result.items():
        assert "error" not in cell, f"{system}/{workload}: {cell.get('traceback', cell)}"
    for workload, metric in [
        ("latency", "p50_ms"),
        ("latency", "p99_ms"),
        ("throughput", "runs_per_s"),
        ("fanout", "p50_ms"),
        ("long_stage", "per_step_ms"),
        ("long_stage", "growth"),
        ("signal", "p50_ms"),
    ]:
        value = result[workload][metric]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (
            f"{system}/{workload}.{metric} = {value!r}"
        )


def test_report_handles_missing_and_failed_cells(tmp_path: object) -> None:
    from pathlib import Path

    from bench._report import check_goals, print_tables, write_png

    results = {
        "native-sqlite": {"latency": {"p50_ms": 2.0, "p99_ms": 3.0}},
        "dbos-sqlite": {"latency": {"error": "ImportError: no dbos"}},
    }
    doc = {
        "mode": "quick",
        "machine": {"nproc": 2, "cpu": "x", "python": "3", "postgresql": "15", "sqlite": "3"},
        "results": results,
        "goals": check_goals(results),
    }
    assert any(g["met"] is None for g in doc["goals"])
    print_tables(doc)
    out = Path(str(tmp_path)) / "x.png"
    write_png(doc, out)
    assert out.stat().st_size > 0
