"""``wfe worker --metrics-port``: a real worker process serves Prometheus metrics on /metrics
(issue 14); the counters match what its runs did."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineMetrics,
    EngineSettings,
    FolderBlobStore,
    NonRetryableError,
    Registry,
    Retry,
    StageContext,
    Workflow,
    attach_metrics,
    create_engine,
    serve_metrics,
)

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve()
WORKER = [sys.executable, "-m", "wfe_cli", "worker"]


def wfe(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``wfe ARGS`` in a child process, its output captured (exit code not checked)."""
    return subprocess.run(
        [sys.executable, "-m", "wfe_cli", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


class In(BaseModel):
    fail: bool = False


def build() -> Registry:
    wf = Workflow("metered", input=In)

    @wf.stage(retry=Retry(max_attempts=3, initial_interval=timedelta(milliseconds=10)))
    async def flaky(ctx: StageContext[In]) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return ctx.attempt

    @wf.stage(after=[flaky])
    async def check(ctx: StageContext[In]) -> str:
        if ctx.input.fail:
            raise NonRetryableError("rejected")
        return "ok"

    return Registry([wf])


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_wfe_worker_serves_metrics(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "PYTHONPATH": str(HERE.parents[2]),
    }
    app = "tests.integration.test_observability_metrics:build"
    proc = subprocess.Popen(
        [*WORKER, "--app", app, "--metrics-port", "0", "--metrics-host", "127.0.0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "the worker exited"
            found = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
            if found:
                url = found.group(1)
        assert url is not None

        async def drive() -> list[str]:
            settings = EngineSettings(
                database_url=env["WFE_DATABASE_URL"], blob_url=env["WFE_BLOB_URL"]
            )
            async with create_engine(settings, build()) as engine:
                runs = [await engine.start("metered", {"fail": i == 2}) for i in range(3)]
                done = [await engine.wait(r.id, timeout=60) for r in runs]
            return [d.status for d in done]

        assert asyncio.run(drive()) == ["completed", "completed", "failed"]

        deadline = time.monotonic() + 30
        while True:  # the database gauges are refreshed every second
            m = scrape(url)
            if value(m, "wfe_runs", workflow="metered", status="failed") == 1:
                break
            assert time.monotonic() < deadline, "wfe_runs never showed the failed run"
            time.sleep(0.2)
        assert value(m, "wfe_runs", workflow="metered", status="completed") == 2
        check_stage_counters(m)
        assert value(m, "wfe_jobs_claimed_total") >= 3  # at least each run's first stage
        assert value(m, "wfe_lease_takeovers_total") == 0
        assert value(m, "wfe_sink_degraded") == 0
        assert ("wfe_queue_lag_seconds", frozenset()) in m
        assert ("wfe_outbox_pending", frozenset()) in m
        assert ("wfe_dead_letters_total", frozenset()) in m
        assert ("wfe_database_retries_total", frozenset()) in m
        # a registry of the worker's own: no default process/platform collectors
        assert not [name for name, _ in m if not name.startswith("wfe_")]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_stage_counters(m: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> None:
    flaky = {"workflow": "metered", "stage": "flaky"}
    check = {"workflow": "metered", "stage": "check"}
    assert value(m, "wfe_stage_attempts_total", **flaky) == 6  # each run: fail, retry
    assert value(m, "wfe_stage_failures_total", **flaky, error_type="RuntimeError") == 3
    assert value(m, "wfe_stage_retries_total", **flaky) == 3
    assert value(m, "wfe_stage_failures_total", **check, error_type="NonRetryableError") == 1
    assert value(m, "wfe_stage_retries_total", **check) == 0
    assert value(m, "wfe_stage_duration_seconds_count", **flaky, outcome="completed") == 3
    assert value(m, "wfe_stage_duration_seconds_count", **flaky, outcome="failed") == 3


@pytest.mark.temporal
async def test_temporal_worker_serves_the_same_stage_metrics(
    temporal_server: Any, tmp_path: Path
) -> None:
    from driver_temporal import create_temporal_engine

    settings = EngineSettings(
        driver="temporal",
        temporal_address=temporal_server.address,
        task_queue=f"metrics-{uuid.uuid4().hex[:10]}",
        blob_url=f"file://{tmp_path / 'b'}",
    )
    engine = create_temporal_engine(settings, build(), blob_store=FolderBlobStore(tmp_path / "b"))
    metrics = EngineMetrics()
    async with engine, engine.worker() as worker:
        attach_metrics(engine, metrics)
        async with serve_metrics(metrics, engine, worker, 0, addr="127.0.0.1") as port:
            runs = [await engine.start("metered", {"fail": i == 2}) for i in range(3)]
            done = [await engine.wait(r.id, timeout=60) for r in runs]
            assert [d.status for d in done] == ["completed", "completed", "failed"]
            m = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
    check_stage_counters(m)


def test_a_metrics_host_not_of_this_machine_is_a_configuration_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}
    env |= {"WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}"}
    app = "tests.integration.test_observability_metrics:build"
    # (203.0.113.0/24: documentation addresses, never local)
    args = ["--app", app, "--metrics-port", "0", "--metrics-host", "203.0.113.7"]
    done = wfe("worker", *args, env=env, cwd=tmp_path)
    assert done.returncode == 6, done.stderr  # bad configuration
    assert "--metrics-host address of this machine" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_busy_metrics_port_is_a_configuration_error(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "PYTHONPATH": str(HERE.parents[2]),
    }
    app = "tests.integration.test_observability_metrics:build"
    started = wfe("start", "metered", "--app", app, "--json", env=env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["id"]
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        done = wfe("worker", "--app", app, "--metrics-port", port, env=env, cwd=tmp_path)
    assert done.returncode == 6, done.stderr  # bad configuration
    assert "choose a free --metrics-port" in done.stderr
    # refused before the worker began: it claimed nothing (it ran the first stage, whose
    # failed attempt then waited for a retry, before the port was found busy)
    assert "worker up" not in done.stdout
    shown = wfe("show", run_id, env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    run = json.loads(shown.stdout)
    assert run["status"] == "pending", run
    assert all(stage["attempt"] == 0 for stage in run["stages"]), run


class _SlowGauges:
    """An engine whose database gauges take 0.2 s to read (a million runs counted)."""

    def __init__(self) -> None:
        self.reads = 0

    async def gauges(self) -> dict[str, Any]:
        self.reads += 1
        await asyncio.sleep(0.2)
        return {"queue_lag_s": 0.0, "runs": {("wf", "completed"): 1_000_000}}


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def stats(self) -> dict[str, Any]:
        self.calls += 1
        return {"claimed": self.calls}


async def test_slow_database_gauges_are_read_seldom_and_worker_counts_as_often_as_asked() -> None:
    # Every worker serving /metrics read the runs per workflow and status every second,
    # whatever that cost: 0.4 s at a million runs on SQLite, 40 % of a database thread.
    engine, worker, metrics = _SlowGauges(), _Counting(), EngineMetrics()
    async with serve_metrics(metrics, engine, worker, 0, addr="127.0.0.1", interval=0.05):
        await asyncio.sleep(2.0)  # (a window of refreshes: ~8 of them read every gauge before)
    assert engine.reads <= 2, f"the gauges were read {engine.reads} times in 2 s"
    assert worker.calls >= 5  # the worker's own counts stay fresh
