"""Probe: hostile ``--metrics-port`` values, and what a scrape sees while the worker's gauges
are refreshed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from engine_port import EngineMetrics, serve_metrics
from engine_port.errors import ConfigurationError

pytest.importorskip("prometheus_client")

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve()


def runs_series(metrics: EngineMetrics) -> dict[tuple[str, str], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.labels["workflow"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "wfe_runs"
    }


class _Gauges:
    def __init__(self, runs: dict[tuple[str, str], int]) -> None:
        self.runs = runs

    async def gauges(self) -> dict[str, Any]:
        return {"queue_lag_s": 0.0, "runs": dict(self.runs)}


async def test_a_scrape_during_a_refresh_sees_every_runs_series() -> None:
    # refresh() cleared wfe_runs and then set each series again: a scrape (from the HTTP
    # server's thread) in between saw no runs at all, or only some statuses
    metrics = EngineMetrics()
    engine = _Gauges({("wf", "completed"): 5, ("wf", "running"): 2, ("other", "failed"): 1})
    await metrics.refresh(engine, object())
    assert runs_series(metrics) == {
        ("wf", "completed"): 5,
        ("wf", "running"): 2,
        ("other", "failed"): 1,
    }
    seen: list[dict[tuple[str, str], float]] = []
    real_labels = metrics.runs.labels

    def labels(*args: Any, **kw: Any) -> Any:
        seen.append(runs_series(metrics))  # a scrape at this moment of the refresh
        return real_labels(*args, **kw)

    metrics.runs.labels = labels  # type: ignore[method-assign]
    engine.runs = {("wf", "completed"): 7, ("wf", "running"): 0, ("other", "failed"): 1}
    await metrics.refresh(engine, object())
    assert seen, "the refresh set no wfe_runs series"
    for scraped in seen:
        assert set(scraped) == {("wf", "completed"), ("wf", "running"), ("other", "failed")}
    assert runs_series(metrics) == {
        ("wf", "completed"): 7,
        ("wf", "running"): 0,
        ("other", "failed"): 1,
    }
    # a (workflow, status) no run has any more is dropped
    engine.runs = {("wf", "completed"): 9}
    await metrics.refresh(engine, object())
    assert runs_series(metrics) == {("wf", "completed"): 9}


@pytest.mark.parametrize("port", [70000, 65536])
async def test_serve_metrics_on_a_port_out_of_range_is_a_configuration_error(port: int) -> None:
    with pytest.raises(ConfigurationError, match="--metrics-port"):
        async with serve_metrics(EngineMetrics(), object(), object(), port, addr="127.0.0.1"):
            pass


def test_wfe_worker_with_a_metrics_port_out_of_range_exits_6(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "PYTHONPATH": str(HERE.parents[2]),
    }
    app = "tests.integration.test_observability_metrics:build"
    done = subprocess.run(
        [sys.executable, "-m", "wfe_cli", "worker", "--app", app, "--metrics-port", "70000"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 6, done.stderr  # bad configuration, not "this is a bug"
    assert "--metrics-port" in done.stderr
    assert "this is a bug" not in done.stderr


class _SlowBacklog:
    """A database whose gauges take a while to read, with a backlog waiting."""

    async def gauges(self) -> dict[str, Any]:
        await asyncio.sleep(2.0)
        return {"queue_lag_s": 12.5, "runs": {("wf", "pending"): 4}}


async def test_the_first_scrape_shows_the_database_gauges() -> None:
    # /metrics was served before the first refresh ended: a scrape in the first moments of a
    # worker said no runs and a queue lag of 0 while 4 runs had waited 12.5 s
    metrics = EngineMetrics()
    async with serve_metrics(metrics, _SlowBacklog(), object(), 0, addr="127.0.0.1") as port:
        url = f"http://127.0.0.1:{port}/metrics"
        text = await asyncio.to_thread(scrape_text, url)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples.get(("wfe_queue_lag_seconds", ())) == 12.5
    assert samples.get(("wfe_runs", (("status", "pending"), ("workflow", "wf")))) == 4


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()
