"""Probe: a run's spans stay in one trace whatever global propagator the application set.

The ``traceparent`` stored with a run used to be written and read through the *global*
propagator: with ``OTEL_PROPAGATORS=b3`` (or jaeger, xray) nothing was stored, and every
stage attempt started a trace of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class OtherHeader(TextMapPropagator):
    """A propagator of another header than ``traceparent`` (as B3's ``b3`` is)."""

    def extract(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        getter: Getter[CarrierT] = default_getter,
    ) -> Context:
        return context if context is not None else Context()

    def inject(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        setter: Setter[CarrierT] = default_setter,
    ) -> None:
        setter.set(carrier, "x-other", "1")

    @property
    def fields(self) -> set[str]:
        return {"x-other"}


class In(BaseModel):
    n: int = 0


def probe_workflow() -> Workflow[In]:
    wf = Workflow("probe-propagator", input=In, version="v1")

    @wf.stage(retry=Retry(max_attempts=2, initial_interval=timedelta(milliseconds=10)))
    async def a(ctx: StageContext[In]) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return ctx.attempt

    return wf


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exp))
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(OtherHeader())
    try:
        yield exp
    finally:
        propagate.set_global_textmap(before)
        exp.shutdown()  # (its processor stays on the provider, exporting nothing)


async def test_stage_spans_join_the_run_under_another_global_propagator(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    engine = create_engine(settings, Registry([probe_workflow()]))
    async with engine, engine.worker():
        with trace.get_tracer("test").start_as_current_span("caller") as caller:
            run = await engine.start("probe-propagator", {})
        info = await engine.wait(run.id, timeout=60)
    assert info.status == "completed"
    trace_id = caller.get_span_context().trace_id
    deadline = time.monotonic() + 10
    while True:
        spans = [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("wfe.run_id")]
        stages = [s for s in spans if s.name == "wfe.stage"]
        if len(stages) >= 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    runs = [s for s in spans if s.name == "wfe.run" and s.context is not None]
    assert len(runs) == 1
    run_span = runs[0].context
    assert run_span is not None and run_span.trace_id == trace_id
    attempts: Mapping[Any, Any] = {
        (s.attributes or {}).get("wfe.attempt"): s for s in stages if s.context is not None
    }
    assert sorted(attempts) == [1, 2]
    for s in stages:  # both attempts (the failed one too) are children of wfe.run
        assert s.context is not None and s.context.trace_id == trace_id, "a trace of its own"
        assert s.parent is not None and s.parent.span_id == run_span.span_id
    assert attempts[1].status.status_code == trace.StatusCode.ERROR
