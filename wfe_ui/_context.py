"""What every route of the web view shares: the engine, the page renderer, the CSRF token, and
the helpers that ask the engine for what only some drivers offer."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from engine_port import Event, Registry, WorkflowEngine
from engine_port.errors import (
    DriverUnavailableError,
    EngineError,
    InvalidInputError,
    RunNotFoundError,
    UnsupportedFeatureError,
    WorkflowNotFoundError,
)

__all__ = ["UiContext", "quote_path", "status_code", "takes_filters", "when", "when_ms"]

_STATUS_CODES: tuple[tuple[type[EngineError], int], ...] = (
    (RunNotFoundError, 404),
    (WorkflowNotFoundError, 404),
    (InvalidInputError, 400),
    (UnsupportedFeatureError, 501),
    (DriverUnavailableError, 503),
)
_PAGE_FILTERS = ("version", "created_after", "id_prefix", "idempotency_key", "outputs")


@dataclass(frozen=True)
class UiContext:
    """One application's shared state (``create_app`` builds it; routes receive it)."""

    engine: WorkflowEngine
    registry: Registry | None
    allow_actions: bool
    csrf: str
    templates: Jinja2Templates

    def page(self, request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        context.setdefault("refresh", 0)
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)

    async def events_of(self, run_id: str) -> tuple[list[Event] | None, str | None]:
        """The run's event stream where the driver offers one (the native driver reads its
        outbox, the Temporal driver the run's histories), else None; and why it is missing
        when the driver offers one but could not give it."""
        method = getattr(self.engine, "events", None)
        if method is None:
            return None, None
        try:
            found: list[Event] = await method(run_id)
        except (RunNotFoundError, DriverUnavailableError):
            raise
        except EngineError as exc:
            return None, str(exc)
        return found, None

    def temporal_history(self, run_id: str) -> str | None:
        """The run in the Temporal Web UI (``temporal_ui_url`` in the settings), for a run of
        the Temporal driver."""
        if self.engine.driver_name != "temporal":
            return None
        settings = getattr(self.engine, "settings", None)
        base = getattr(settings, "temporal_ui_url", None)
        if not isinstance(base, str) or not base.startswith(("http://", "https://")):
            return None
        namespace = getattr(settings, "temporal_namespace", "default")
        query = urlencode({"query": f'WorkflowId="{run_id}"'})
        return f"{base.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows?{query}"


def when(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def when_ms(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def status_code(exc: EngineError) -> int:
    for kind, code in _STATUS_CODES:
        if isinstance(exc, kind):
            return code
    return 409  # an engine error is one a user can cause: the request does not fit the state


def takes_filters(method: Callable[..., Any]) -> bool:
    """Whether a driver's ``list_runs_page`` applies every filter of the runs list itself
    (the native and Temporal drivers do); else the view filters the newest runs it reads."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return all(name in params for name in _PAGE_FILTERS)


def quote_path(run_id: str) -> str:
    return quote(run_id, safe="")
