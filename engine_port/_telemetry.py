"""OpenTelemetry spans of runs, the same on every driver (optional extra ``wfe[otel]``).

The engine calls the OpenTelemetry *API* only (tracer ``wfe``, the global tracer provider);
the application configures the SDK and its exporters. Without ``opentelemetry`` installed
every function here is a no-op, and nothing is imported before the first span.

The spans (names in :data:`SPAN_NAMES`), all with ``wfe.run_id``, ``wfe.workflow`` and
``wfe.version``:

- ``wfe.start``: the ``start()`` call, a child of the caller's current span;
- ``wfe.run``: the root of the run's work, a child of ``wfe.start``. Its W3C
  ``traceparent`` is stored with the run, so every stage attempt, in any process and on any
  driver, is its child. It ends when ``start()`` returns (a run outlives processes; the
  stages are its children and outlive it);
- ``wfe.stage``: one stage attempt (``wfe.stage``, ``wfe.attempt``, ``wfe.outcome``);
- ``wfe.compensation``: one try of a stage's compensation;
- ``wfe.step``: one durable step that ran (not a replay), child of its attempt;
- ``wfe.signal``: the ``signal()`` call (``wfe.signal``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, TypeVar, cast

from ._limits import safe_error_message

__all__ = [
    "SPAN_NAMES",
    "SpanHandle",
    "attributes",
    "current_traceparent",
    "set_run",
    "signal_span",
    "span",
    "start_spans",
    "step_span",
    "traced_signal",
    "traced_start",
]

SPAN_NAMES = ("wfe.start", "wfe.run", "wfe.stage", "wfe.compensation", "wfe.step", "wfe.signal")
TRACER_NAME = "wfe"

AttrValue = str | int | float | bool

# the attributes of the stage attempt running in this context, for its step spans
_stage_attrs: contextvars.ContextVar[Mapping[str, AttrValue] | None] = contextvars.ContextVar(
    "wfe_stage_span_attrs", default=None
)


@functools.cache
def _otel() -> tuple[ModuleType, Any, ModuleType] | None:
    """(trace, propagator, context) of the OpenTelemetry API, or None when not installed.

    The propagator is always W3C Trace Context, never the global one: what is stored with a
    run is a ``traceparent``, and an application whose global propagator is another one
    (``OTEL_PROPAGATORS=b3``, ``jaeger``, ``xray``) would store nothing (its inject writes
    other headers) or read nothing back (its extract ignores ``traceparent``): every stage
    attempt would start a trace of its own."""
    try:
        trace = importlib.import_module("opentelemetry.trace")
        context = importlib.import_module("opentelemetry.context")
        tracecontext = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
    except ImportError:
        return None
    return trace, tracecontext.TraceContextTextMapPropagator(), context


def _recording(trace: ModuleType) -> bool:
    """Whether the application has set a tracer provider. Until it does, the API's proxy (or
    its no-op provider) records nothing, but opening a span through it still costs ~20 us of
    CPU (a tracer, a context attach and detach): a run's few spans were ~5% of a native run's
    CPU on PostgreSQL. Asked at every span, so a provider set later is used at once."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def attributes(
    run_id: str | None, workflow: str, version: str | None, **more: AttrValue | None
) -> dict[str, AttrValue]:
    """The ``wfe.*`` attributes of a span (``None`` values left out)."""
    attrs: dict[str, AttrValue | None] = {
        "wfe.run_id": run_id,
        "wfe.workflow": workflow,
        "wfe.version": version,
    }
    attrs.update({f"wfe.{k}": v for k, v in more.items()})
    return {k: v for k, v in attrs.items() if v is not None}


class SpanHandle:
    """What the engine does with an open span; a no-op without OpenTelemetry."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, key: str, value: AttrValue | None) -> None:
        if self._span is not None and value is not None:
            self._span.set_attribute(key, value)

    def fail(self, error_type: str, message: str) -> None:
        """Mark the span failed (status ERROR) with the error's type and message."""
        if self._span is None:
            return
        otel = _otel()
        assert otel is not None
        trace = otel[0]
        self._span.set_attribute("wfe.error_type", error_type)
        self._span.set_status(trace.Status(trace.StatusCode.ERROR, f"{error_type}: {message}"))


@contextlib.contextmanager
def span(
    name: str,
    attrs: Mapping[str, AttrValue] | Callable[[], Mapping[str, AttrValue]],
    *,
    parent: str | None = None,
    stage: bool = False,
) -> Iterator[SpanHandle]:
    """Open span ``name`` as the current span. ``attrs``: its attributes, or a function
    that makes them (called only when a span is recorded: most hosts set no tracer provider,
    and a stage attempt's attributes cost more than the check). ``parent``: a W3C
    ``traceparent`` to be the child of (a run's stored one) instead of the current span.
    ``stage``: its step spans get its attributes."""
    otel = _otel()
    if otel is None or not _recording(otel[0]):
        yield SpanHandle()
        return
    if callable(attrs):
        attrs = attrs()
    trace, propagator, _context = otel
    ctx = None if parent is None else propagator.extract({"traceparent": parent})
    tracer = trace.get_tracer(TRACER_NAME)
    token = _stage_attrs.set(attrs) if stage else None
    try:
        with tracer.start_as_current_span(
            name,
            context=ctx,
            attributes=dict(attrs),
            record_exception=False,
            set_status_on_exception=False,
        ) as sp:
            try:
                yield SpanHandle(sp)
            except Exception as exc:
                # (what OTel's own status on an exception does, but its description made
                # with str(exc): an exception whose __str__ raises replaced the body's error,
                # recorded as that RuntimeError, on every host with a tracer provider)
                sp.set_status(
                    trace.Status(
                        trace.StatusCode.ERROR, f"{type(exc).__name__}: {safe_error_message(exc)}"
                    )
                )
                raise
    finally:
        if token is not None:
            _stage_attrs.reset(token)


@contextlib.contextmanager
def step_span(name: str) -> Iterator[SpanHandle]:
    """A ``wfe.step`` span for the durable step ``name`` of the attempt running here."""
    if _otel() is None:
        yield SpanHandle()
        return
    attrs = dict(_stage_attrs.get() or {})
    attrs["wfe.step"] = name
    with span("wfe.step", attrs) as sp:
        yield sp


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span (None without one or without OTel)."""
    otel = _otel()
    if otel is None:
        return None
    carrier: dict[str, str] = {}
    otel[1].inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def start_spans(workflow: str, version: str | None) -> Iterator[tuple[SpanHandle, SpanHandle]]:
    """``wfe.start`` and its child ``wfe.run`` around a driver's ``start()``: store
    :func:`current_traceparent` (the run span's) with the run; set ``wfe.run_id`` on both
    once it is known (:func:`set_run_id`)."""
    otel = _otel()
    if otel is None or not _recording(otel[0]):  # (asked once for both spans)
        yield SpanHandle(), SpanHandle()
        return
    attrs = attributes(None, workflow, version)
    with span("wfe.start", attrs) as start, span("wfe.run", attrs) as run:
        yield start, run


@contextlib.contextmanager
def signal_span(run_id: str, name: str) -> Iterator[SpanHandle]:
    """``wfe.signal`` around a driver's ``signal()``."""
    with span("wfe.signal", {"wfe.run_id": run_id, "wfe.signal": name}) as sp:
        yield sp


_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


def traced_start(fn: _F) -> _F:
    """Decorate a driver's ``start()``: it runs inside ``wfe.start`` > ``wfe.run`` (store
    :func:`current_traceparent` with the run), whose ids are set from the RunInfo it returns."""

    @functools.wraps(fn)
    async def start(self: Any, workflow: Any, input: Any, *args: Any, **kw: Any) -> Any:
        wf_id = getattr(workflow, "id", workflow)
        with start_spans(str(wf_id), kw.get("version")) as spans:
            info = await fn(self, workflow, input, *args, **kw)
            set_run(spans, info.id, info.version)
        return info

    return cast(_F, start)


def traced_signal(fn: _F) -> _F:
    """Decorate a driver's ``signal(run_id, name, ...)``: it runs inside ``wfe.signal``."""

    @functools.wraps(fn)
    async def signal(self: Any, run_id: Any, name: Any, *args: Any, **kw: Any) -> Any:
        with signal_span(str(run_id), str(name)):
            return await fn(self, run_id, name, *args, **kw)

    return cast(_F, signal)


def set_run(handles: tuple[SpanHandle, SpanHandle], run_id: str, version: str) -> None:
    for h in handles:
        h.set("wfe.run_id", run_id)
        h.set("wfe.version", version)
