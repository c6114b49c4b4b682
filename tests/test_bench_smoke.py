"""The benchmark harness must not rot: every workload once, at tiny size, for every system of
``python -m bench`` (DBOS only when dbos is installed; the PostgreSQL and Temporal systems
against the real servers, like the rest of the suite). This checks that numbers come out,
never how big they are: benchmarks are not timed assertions."""

from __future__ import annotations

import importlib.util
import math

import pytest

import bench._common
from bench._common import WORKLOADS
from bench._systems import SYSTEMS as BENCH_SYSTEMS
from bench._systems import run_one
from tests.support.databases import admin_url

_NO_DBOS = pytest.mark.skipif(
    importlib.util.find_spec("dbos") is None,
    reason="dbos is not installed (pip install 'wfe[bench]')",
)
SYSTEMS = [
    "native-sqlite",
    "floor-sqlite",
    pytest.param("dbos-sqlite", marks=_NO_DBOS),
    pytest.param("native-postgres", marks=pytest.mark.postgres),
    pytest.param("floor-postgres", marks=pytest.mark.postgres),
    pytest.param("dbos-postgres", marks=[pytest.mark.postgres, _NO_DBOS]),
    pytest.param("temporal-driver", marks=pytest.mark.temporal),
    pytest.param("temporal-driver-local", marks=pytest.mark.temporal),
    pytest.param("temporal-raw", marks=pytest.mark.temporal),
    pytest.param("temporal-raw-local", marks=pytest.mark.temporal),
    pytest.param("temporal-paired", marks=pytest.mark.temporal),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("system", SYSTEMS)
def test_every_workload_produces_numbers(
    system: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if system.endswith("-postgres"):
        request.getfixturevalue("pg_session")  # the server is there (else skip, or fail on CI)
        monkeypatch.setattr(bench._common, "PG_ADMIN", admin_url().replace("+psycopg", "", 1))
    result = run_one(system, quick=True)
    expected = ["latency"] if BENCH_SYSTEMS[system].latency_only else list(WORKLOADS)
    if BENCH_SYSTEMS[system].paired:  # both sides in each cell, and their ratios
        expected = ["latency", "local", "throughput", "fanout", "signal"]
    assert set(result) == set(expected)
    for workload, cell in result.items():
        assert "error" not in cell, f"{system}/{workload}: {cell.get('traceback', cell)}"
        if BENCH_SYSTEMS[system].paired:
            metric = "runs_per_s" if workload == "throughput" else "p50_ms"
            for key in (metric, f"raw_{metric}", "ratio", "pair_ratio_p50"):
                assert math.isfinite(cell[key]) and cell[key] > 0, f"{workload}.{key}"
            ours, theirs = cell[metric], cell[f"raw_{metric}"]
            expect = theirs / ours if metric == "runs_per_s" else ours / theirs
            assert cell["ratio"] == pytest.approx(expect)  # driver cost / hand-written cost
    if BENCH_SYSTEMS[system].paired:
        return
    for workload, metric in [
        ("latency", "p50_ms"),
        ("latency", "p99_ms"),
        ("throughput", "runs_per_s"),
        ("fanout", "p50_ms"),
        ("long_stage", "per_step_ms"),
        ("long_stage", "growth"),
        ("signal", "p50_ms"),
    ]:
        if workload not in expected:
            continue
        value = result[workload][metric]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (
            f"{system}/{workload}.{metric} = {value!r}"
        )


@pytest.mark.temporal
@pytest.mark.timeout(180)
def test_temporal_systems_measure_every_workload_on_one_dev_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver and the hand-written system each measure throughput on the dev server their
    other workloads used: a used dev server costs more CPU per run than a fresh one, and the
    hand-written row alone got a fresh one (its ratio favoured it by ~0.15)."""
    import asyncio
    import contextlib
    from collections.abc import AsyncIterator

    import bench._temporal as T
    from bench._common import Sizes

    real = T.dev_server
    started: list[str] = []

    @contextlib.asynccontextmanager
    async def counted() -> AsyncIterator[str]:
        async with real() as address:
            started.append(address)
            yield address

    monkeypatch.setattr(T, "dev_server", counted)
    for run in (T.run_temporal_driver, T.run_temporal_raw):
        started.clear()
        out = asyncio.run(run(Sizes.quick()))
        assert "error" not in out["throughput"], out["throughput"]
        assert len(started) == 1, f"{run.__name__} started {len(started)} dev servers"


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


def test_temporal_goals_compare_the_driver_with_hand_written_temporalio() -> None:
    """Issue 13: driver / hand-written <= 1.1 on latency, throughput, fan-out and signal;
    hand-written activities / driver local=True stages >= 2."""
    from bench._report import check_goals, markdown

    results = {
        "temporal-driver": {
            "latency": {"p50_ms": 100.0, "p99_ms": 120.0},
            "throughput": {"runs_per_s": 10.0},
            "fanout": {"p50_ms": 500.0},
            "signal": {"p50_ms": 50.0},
        },
        "temporal-driver-local": {"latency": {"p50_ms": 40.0, "p99_ms": 50.0}},
        "temporal-raw": {
            "latency": {"p50_ms": 100.0, "p99_ms": 110.0},
            "throughput": {"runs_per_s": 20.0},  # the driver does half as many runs per second
            "fanout": {"p50_ms": 460.0},
            "signal": {"error": "TimeoutError: ..."},
        },
    }
    goals = {g["goal"].split(" (")[0]: g for g in check_goals(results)}
    lat = goals["temporal: driver 3-stage latency within 1.1x of hand-written temporalio"]
    assert (lat["ratio"], lat["met"]) == (1.0, True)
    thr = goals["temporal: driver throughput within 1.1x of hand-written temporalio"]
    assert (thr["ratio"], thr["met"]) == (2.0, False)
    fan = goals["temporal: driver fan-out 1->50->1 within 1.1x of hand-written temporalio"]
    assert fan["met"] is True and abs(fan["ratio"] - 500 / 460) < 1e-9
    sig = goals["temporal: driver signal round trip within 1.1x of hand-written temporalio"]
    assert (sig["ratio"], sig["met"]) == (None, None)  # not measured, never "met"
    local = goals[
        "temporal: driver local=True stages at least 2x faster than hand-written activities"
    ]
    assert (local["ratio"], local["met"]) == (2.5, True)
    doc = {"results": results, "goals": check_goals(results)}
    assert "| temporal: driver throughput within 1.1x" in markdown(doc)
    paired = goals[
        "temporal, paired: driver fan-out 1->50->1 within 1.1x of hand-written temporalio"
    ]
    assert (paired["ratio"], paired["met"]) == (None, None)  # no paired system in this run


def test_paired_temporal_goals_read_the_paired_ratios() -> None:
    """``temporal-paired``: each issue-13 goal judged on the cell's ratio (driver cost /
    hand-written cost), shown in its own table, not among the systems."""
    from bench._report import check_goals, markdown, print_tables

    results = {
        "temporal-paired": {
            "latency": {
                "p50_ms": 104.0,
                "raw_p50_ms": 100.0,
                "ratio": 1.04,
                "pair_ratio_p50": 1.05,
            },
            "throughput": {
                "runs_per_s": 15.0,
                "raw_runs_per_s": 18.0,
                "ratio": 1.2,
                "pair_ratio_p50": 1.19,
            },
            "fanout": {"error": "TimeoutError: ..."},
            "signal": {"p50_ms": 41.0, "raw_p50_ms": 40.0, "ratio": 1.025, "pair_ratio_p50": 1.0},
            "local": {"p50_ms": 40.0, "raw_p50_ms": 100.0, "ratio": 0.4, "pair_ratio_p50": 0.45},
        }
    }
    goals = {g["goal"].split(" (")[0]: g for g in check_goals(results)}
    prefix = "temporal, paired: driver "
    suffix = " within 1.1x of hand-written temporalio"
    assert goals[prefix + "3-stage latency" + suffix]["met"] is True
    assert goals[prefix + "throughput" + suffix]["met"] is False
    assert goals[prefix + "fan-out 1->50->1" + suffix]["met"] is None
    assert goals[prefix + "signal round trip" + suffix]["ratio"] == 1.025
    local = goals[
        "temporal, paired: driver local=True stages at least 2x faster than hand-written activities"
    ]
    assert (local["ratio"], local["met"]) == (2.5, True)  # hand-written p50 / driver-local p50
    doc = {
        "mode": "full",
        "machine": {"nproc": 2, "cpu": "x", "python": "3", "postgresql": "15", "sqlite": "3"},
        "results": results,
        "goals": check_goals(results),
    }
    md = markdown(doc)
    assert "| 3-stage latency | 104 ms p50 | 100 ms p50 | 1.04 | 1.05 |" in md
    assert "| Temporal driver and hand-written temporalio, paired |" not in md  # not a system row
    print_tables(doc)


def test_rounds_combine_to_medians() -> None:
    """``--rounds N``: each number is the median over the rounds a workload ran in, a workload
    that failed in one round keeps the others, one that failed in all keeps its error."""
    from bench._common import combine_rounds

    rounds = [
        {"latency": {"p50_ms": 5.0, "n": 10, "wall_s": 1.0}, "signal": {"error": "x"}},
        {"latency": {"p50_ms": 9.0, "n": 10, "wall_s": 2.0}, "signal": {"error": "y"}},
        {"latency": {"error": "timed out"}, "signal": {"error": "z"}},
        {"latency": {"p50_ms": 6.0, "n": 10, "wall_s": 1.5}},
    ]
    out = combine_rounds(rounds)
    assert out["latency"]["p50_ms"] == 6.0
    assert out["latency"]["n"] == 30 and out["latency"]["wall_s"] == 4.5
    assert out["latency"]["rounds"] == 3 and len(out["latency"]["per_round"]) == 3
    assert out["signal"] == {"error": "x"}


@pytest.mark.temporal
@pytest.mark.timeout(120)
def test_hand_written_pinned_runs_on_its_worker_deployment_version() -> None:
    """``temporal_throughput --pinned`` measures what pinning costs: its hand-written runs must
    really be pinned to the worker's deployment version (else it measures plain runs twice)."""
    import asyncio
    import uuid

    from temporalio.api.enums.v1 import VersioningBehavior
    from temporalio.client import Client
    from temporalio.common import PinnedVersioningOverride, WorkerDeploymentVersion

    import bench._temporal_raw as raw
    from tests.support.temporal import roomy_dev_server

    async def go() -> None:
        async with (
            roomy_dev_server(headless=True) as server,
            raw.worker(server.address, pinned=True),
        ):
            client = await Client.connect(server.address)
            version = WorkerDeploymentVersion(*raw.PINNED)
            deadline = asyncio.get_running_loop().time() + 60
            while True:  # (the version exists once the server saw the worker poll)
                try:
                    handle = await client.start_workflow(
                        "bench_seq3",
                        False,
                        id=uuid.uuid4().hex,
                        task_queue=raw.TASK_QUEUE,
                        versioning_override=PinnedVersioningOverride(version),
                    )
                    break
                except Exception:
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            assert await handle.result() == 3
            desc = await handle.describe()
            info = desc.raw_description.workflow_execution_info.versioning_info
            assert info.behavior == VersioningBehavior.VERSIONING_BEHAVIOR_PINNED
            assert info.deployment_version.build_id == raw.PINNED[1]
            assert info.deployment_version.deployment_name == raw.PINNED[0]

    asyncio.run(go())
