"""OpenTelemetry spans: the same span tree (names, parent links, wfe.* attributes) for the same
run on the native driver (SQLite) and on Temporal, under the span of the start() caller; and
the stage spans of a `wfe worker` process join the trace of the process that started the run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from engine_port import (
    EngineSettings,
    FolderBlobStore,
    NonRetryableError,
    Registry,
    StageContext,
    Workflow,
    WorkflowEngine,
    create_engine,
)

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class In(BaseModel):
    n: int = 0


def traced_workflow() -> Workflow[In]:
    """a (a durable step, a compensation) -> b (waits for signal "go") -> c (fails for good):
    the run fails and compensates a."""
    wf = Workflow("traced", input=In, version="v1")

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return int(await ctx.step.run("charge", lambda: 7))

    @a.compensation
    async def undo(ctx: StageContext[In], out: int) -> None:
        await ctx.step.run("refund", lambda: None)

    @wf.stage(after=[a])
    async def b(ctx: StageContext[In]) -> str:
        return str(await ctx.step.wait_for_signal("go"))

    @wf.stage(after=[b])
    async def c(ctx: StageContext[In]) -> None:
        raise NonRetryableError("out of stock")

    return wf


# (span, parent span, stage, attempt, outcome, step or signal): every span of the run's trace
EXPECTED = {
    ("caller", None, None, None, None, None),
    ("wfe.start", "caller", None, None, None, None),
    ("wfe.run", "wfe.start", None, None, None, None),
    ("wfe.stage", "wfe.run", "a", 1, "completed", None),
    ("wfe.step", "wfe.stage", "a", 1, None, "charge"),
    ("wfe.stage", "wfe.run", "b", 1, "suspended", None),
    ("wfe.signal", "caller", None, None, None, "go"),
    ("wfe.stage", "wfe.run", "b", 1, "completed", None),
    ("wfe.stage", "wfe.run", "c", 1, "failed", None),
    ("wfe.compensation", "wfe.run", "a", 1, "completed", None),
    ("wfe.step", "wfe.compensation", "a", 1, None, "refund"),
}


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """An in-memory exporter on the (process-wide) SDK tracer provider."""
    exp = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exp))
    yield exp
    exp.clear()


def span_tree(spans: tuple[ReadableSpan, ...], trace_id: int) -> set[tuple[Any, ...]]:
    mine = [s for s in spans if s.context is not None and s.context.trace_id == trace_id]
    names = {s.context.span_id: s.name for s in mine if s.context is not None}
    tree = set()
    for s in mine:
        attrs = s.attributes or {}
        parent = None if s.parent is None else names.get(s.parent.span_id, "?")
        tree.add(
            (
                s.name,
                parent,
                attrs.get("wfe.stage"),
                attrs.get("wfe.attempt"),
                attrs.get("wfe.outcome"),
                attrs.get("wfe.step") or attrs.get("wfe.signal"),
            )
        )
    return tree


async def drive(starter: WorkflowEngine, worker_engine: WorkflowEngine) -> tuple[str, int]:
    """Start the run under a caller's span on ``starter``; run it with ``worker_engine``'s
    worker (another engine object: the trace context travels with the run)."""
    tracer = trace.get_tracer("test")
    async with worker_engine.worker():
        with tracer.start_as_current_span("caller") as caller:
            run = await starter.start("traced", {"n": 1})
            deadline = time.monotonic() + 30
            while (await starter.get_run(run.id)).stage("b").status != "suspended":
                assert time.monotonic() < deadline, "stage b never waited for its signal"
                await asyncio.sleep(0.05)
            await starter.signal(run.id, "go", "now")
        info = await starter.wait(run.id, timeout=30)
    assert info.status == "failed"
    return run.id, caller.get_span_context().trace_id


def check_attributes(spans: tuple[ReadableSpan, ...], trace_id: int, run_id: str) -> None:
    for s in spans:
        if s.context is None or s.context.trace_id != trace_id or s.name == "caller":
            continue
        attrs = s.attributes or {}
        assert attrs.get("wfe.run_id") == run_id, s.name
        if s.name != "wfe.signal":
            assert attrs.get("wfe.workflow") == "traced", s.name
            assert attrs.get("wfe.version") == "v1", s.name
        if s.name == "wfe.stage" and attrs.get("wfe.stage") == "c":
            assert s.status.status_code == trace.StatusCode.ERROR
            assert attrs.get("wfe.error_type") == "NonRetryableError"


async def test_native_span_tree(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    starter = create_engine(settings, Registry([traced_workflow()]))
    worker = create_engine(settings, Registry([traced_workflow()]))
    async with starter, worker:
        run_id, trace_id = await drive(starter, worker)
    spans = exporter.get_finished_spans()
    assert span_tree(spans, trace_id) == EXPECTED
    check_attributes(spans, trace_id, run_id)


class _StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


async def test_a_traced_step_whose_error_cannot_be_printed_keeps_its_error(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    """With a tracer provider recording, OTel's own status on an exception leaving a span
    formatted it with ``str()``: a step raising an exception whose ``__str__`` raises was
    recorded as that ``RuntimeError`` instead of its own error (until 2026-12-06). Its span
    is marked failed, described as the stored error is."""
    wf = Workflow(f"traced-str-{uuid.uuid4().hex[:8]}", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> None:
        def boom() -> None:
            raise _StrRaises()

        await ctx.step.run("boom", boom)

    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    async with create_engine(settings, Registry([wf])) as engine, engine.worker():
        run = await engine.start(wf, {})
        done = await engine.wait(run.id, timeout=30)
    assert done.error is not None
    assert (done.error.type, done.error.message) == (
        "_StrRaises",
        "<_StrRaises: str() raised RuntimeError>",
    )
    steps = [
        sp
        for sp in exporter.get_finished_spans()
        if sp.name == "wfe.step" and (sp.attributes or {}).get("wfe.run_id") == run.id
    ]
    assert steps and all(not sp.status.is_ok for sp in steps)
    assert steps[0].status.description == "_StrRaises: <_StrRaises: str() raised RuntimeError>"


@pytest.mark.temporal
async def test_temporal_span_tree(
    temporal_server: Any, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    from driver_temporal import create_temporal_engine

    def make() -> WorkflowEngine:
        settings = EngineSettings(
            driver="temporal",
            temporal_address=temporal_server.address,
            task_queue=f"obs-{queue}",
            blob_url=f"file://{tmp_path / 'b'}",
        )
        return create_temporal_engine(
            settings, Registry([traced_workflow()]), blob_store=FolderBlobStore(tmp_path / "b")
        )

    queue = uuid.uuid4().hex[:10]
    starter, worker = make(), make()
    async with starter, worker:
        run_id, trace_id = await drive(starter, worker)
    spans = exporter.get_finished_spans()
    assert span_tree(spans, trace_id) == EXPECTED
    check_attributes(spans, trace_id, run_id)


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file as one JSON line (the worker process's spans)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as f:
            for s in spans:
                assert s.context is not None
                doc = {
                    "name": s.name,
                    "trace_id": s.context.trace_id,
                    "span_id": s.context.span_id,
                    "parent_id": None if s.parent is None else s.parent.span_id,
                    "attributes": dict(s.attributes or {}),
                }
                f.write(json.dumps(doc) + "\n")
        return SpanExportResult.SUCCESS


def worker_app() -> Registry:
    """The ``--app`` of the worker process: the SDK exporting to $WFE_TEST_SPANS."""
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(JsonLinesExporter(os.environ["WFE_TEST_SPANS"]))
    )
    trace.set_tracer_provider(provider)
    return Registry([traced_workflow()])


def test_stage_spans_of_a_worker_process_join_the_callers_trace(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    spans_file = tmp_path / "worker-spans.jsonl"
    env = {
        **os.environ,
        "WFE_DATABASE_URL": f"sqlite:///{tmp_path / 'wfe.db'}",
        "WFE_BLOB_URL": f"file://{tmp_path / 'blobs'}",
        "WFE_TEST_SPANS": str(spans_file),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    app = "tests.integration.test_observability_traces:worker_app"
    proc = subprocess.Popen(
        [sys.executable, "-m", "wfe_cli", "worker", "--app", app],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:

        async def start() -> tuple[str, int]:
            settings = EngineSettings(
                database_url=env["WFE_DATABASE_URL"], blob_url=env["WFE_BLOB_URL"]
            )
            async with create_engine(settings, Registry([traced_workflow()])) as engine:
                with trace.get_tracer("test").start_as_current_span("caller") as caller:
                    run = await engine.start("traced", {})
                    await engine.signal(run.id, "go", "now")  # queued until b waits
                info = await engine.wait(run.id, timeout=60)
            assert info.status == "failed"
            return run.id, caller.get_span_context().trace_id

        run_id, trace_id = asyncio.run(start())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    here = [
        s
        for s in exporter.get_finished_spans()
        if s.context is not None and s.context.trace_id == trace_id and s.name == "wfe.run"
    ]
    assert len(here) == 1 and here[0].context is not None
    run_span_id = here[0].context.span_id
    there = [json.loads(line) for line in spans_file.read_text().splitlines()]
    stages = [d for d in there if d["name"] in ("wfe.stage", "wfe.compensation")]
    assert {(d["name"], d["attributes"]["wfe.stage"]) for d in stages} == {
        ("wfe.stage", "a"),
        ("wfe.stage", "b"),
        ("wfe.stage", "c"),
        ("wfe.compensation", "a"),
    }
    for d in stages:  # children of this process's wfe.run span, in the caller's trace
        assert (d["trace_id"], d["parent_id"]) == (trace_id, run_span_id), d
        assert d["attributes"]["wfe.run_id"] == run_id
    steps = [d for d in there if d["name"] == "wfe.step"]
    assert {d["attributes"]["wfe.step"] for d in steps} == {"charge", "refund"}
    assert all(d["trace_id"] == trace_id for d in steps)
