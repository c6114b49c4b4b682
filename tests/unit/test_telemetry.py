"""Traces and metrics are optional: importing the engine imports neither OpenTelemetry nor
prometheus-client, and a run works (spans are no-ops) when OpenTelemetry is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RUN_WITHOUT_OTEL = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if not installed: every import of it fails
from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from engine_port import _telemetry
from pydantic import BaseModel

class In(BaseModel):
    n: int = 0

wf = Workflow("plain", input=In)

@wf.stage
async def a(ctx: StageContext[In]) -> int:
    return int(await ctx.step.run("one", lambda: 1))

async def main() -> None:
    settings = EngineSettings(database_url=sys.argv[1], blob_url=sys.argv[2])
    async with create_engine(settings, Registry([wf])) as engine:
        run = await engine.start("plain", {})
        await engine.signal(run.id, "ignored", 1)
        async with engine.worker():
            info = await engine.wait(run.id, timeout=30)
    assert info.status == "completed" and info.output == 1, info
    assert _telemetry.current_traceparent() is None
    print("ok")

asyncio.run(main())
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_importing_the_engine_imports_no_telemetry_library() -> None:
    done = _python(
        "import sys, engine_port, wfe_cli, driver_native\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('opentelemetry', 'prometheus_client')))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_run_works_without_opentelemetry(tmp_path: Path) -> None:
    done = _python(
        RUN_WITHOUT_OTEL, f"sqlite:///{tmp_path / 'wfe.db'}", f"file://{tmp_path / 'blobs'}"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_metrics_without_prometheus_client_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine_port import EngineMetrics
    from engine_port.errors import ConfigurationError

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError, match=r"wfe\[metrics\]"):
        EngineMetrics()


def test_no_span_is_opened_until_the_application_sets_a_tracer_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the OpenTelemetry API installed but no SDK configured (the API's proxy provider),
    the engine opens no span: they would record nothing and cost CPU on every stage."""
    trace = pytest.importorskip("opentelemetry.trace")
    from engine_port import _telemetry

    def no_tracer(*_a: object, **_k: object) -> None:
        raise AssertionError("a span was opened while no tracer provider is set")

    for provider in (trace.ProxyTracerProvider(), trace.NoOpTracerProvider()):
        monkeypatch.setattr(trace, "get_tracer_provider", lambda p=provider: p)
        monkeypatch.setattr(trace, "get_tracer", no_tracer)
        with _telemetry.start_spans("wf", "v1") as (start, _run):
            start.set("wfe.run_id", "r1")
        with _telemetry.span("wfe.stage", {"wfe.stage": "a"}, stage=True) as sp:
            sp.fail("ValueError", "boom")
            with _telemetry.step_span("one"):
                pass
