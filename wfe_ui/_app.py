"""The Starlette application behind ``wfe ui``: server-rendered pages over the engine port.

The routes live per kind in ``_pages`` (GET) and ``_actions`` (POST); they share one
``_context.UiContext``."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from engine_port import Registry, RunStatus, WorkflowEngine
from engine_port.driver import describe_fault, is_storage_fault
from engine_port.errors import EngineError

from ._actions import action_routes
from ._context import UiContext, quote_path, status_code, when, when_ms
from ._inputs import LIMITS, REFRESH_SECONDS
from ._pages import page_routes

__all__ = ["create_app"]

_HERE = Path(__file__).parent
_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _SecurityHeaders:
    """Strict headers on every response: no framing, no foreign scripts, no caching."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + _HEADERS
            await send(message)

        await self.app(scope, receive, with_headers)


def _templates(engine: WorkflowEngine, allow_actions: bool, csrf: str) -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = when
    env.filters["path"] = quote_path
    env.filters["when_ms"] = when_ms
    env.globals.update(
        allow_actions=allow_actions,
        csrf=csrf,
        driver=engine.driver_name,
        statuses=[s.value for s in RunStatus],
        limits=LIMITS,
        refreshes=REFRESH_SECONDS,
        urlencode=lambda q: urlencode(q, doseq=True),
    )
    return Jinja2Templates(env=env)


def create_app(
    engine: WorkflowEngine,
    *,
    registry: Registry | None = None,
    allow_actions: bool = False,
    allowed_hosts: list[str] | None = None,
    connect: bool = True,
) -> Starlette:
    """The web view over ``engine``: read-only unless ``allow_actions``.

    The engine is connected for the application's lifetime (``connect=False`` when the caller
    already did). ``registry`` (the ``--app`` of ``wfe ui``) draws each run's execution groups;
    ``allowed_hosts`` refuses requests for other ``Host`` names (DNS rebinding)."""
    csrf = secrets.token_urlsafe(32)
    ctx = UiContext(
        engine=engine,
        registry=registry if registry is not None else engine.registry,
        allow_actions=allow_actions,
        csrf=csrf,
        templates=_templates(engine, allow_actions, csrf),
    )

    async def engine_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngineError)
        code = status_code(exc)
        return ctx.page(request, "error.html", status_code=code, problem=str(exc), title="Error")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        problem = exc.detail
        headers = dict(exc.headers or {})
        if exc.status_code == 404 and problem == "Not Found":
            problem = (
                "there is no page at this address; the runs are at /runs and a run's page "
                "is /runs/RUN_ID (a run id has no '/')"
            )
        elif exc.status_code == 405 and problem == "Method Not Allowed":
            allowed = headers.get("Allow", "")
            problem = f"{request.method} is not accepted at this address (it takes {allowed}); " + (
                "use the buttons on the run's page"
                if "POST" in allowed
                else "open it in the browser"
            )
        response = ctx.page(
            request, "error.html", status_code=exc.status_code, problem=problem, title="Error"
        )
        response.headers.update(headers)  # Allow on a 405, as HTTP requires
        return response

    async def unexpected_error(request: Request, exc: Exception) -> Response:
        """What the page says when the engine fails in a way it did not translate (a database
        error leaking out of a driver): no traceback on the page (the server log has it); 503
        when the storage is unreachable or failing (retrying later may work), else 500."""
        unavailable = is_storage_fault(exc)
        problem = f"the web view could not answer: {describe_fault(exc)}. " + (
            "The engine's storage is unreachable or failing: check that the database "
            "runs and that database_url is right, then reload the page."
            if unavailable
            else "This is a fault of the server or its database, not of your request; "
            "the server log has the details."
        )
        code = 503 if unavailable else 500
        try:
            response = ctx.page(
                request, "error.html", status_code=code, problem=problem, title="Error"
            )
        except Exception:  # the page itself cannot be drawn: say it in plain text
            response = PlainTextResponse(problem, status_code=code)
        # answered outside the middleware (by Starlette's outermost one): the same headers
        response.raw_headers.extend(_HEADERS)
        return response

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if not connect:
            yield
            return
        async with engine:
            yield

    middleware = [Middleware(_SecurityHeaders)]
    if allowed_hosts:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    routes: list[BaseRoute] = [
        *page_routes(ctx),
        *action_routes(ctx),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            EngineError: engine_error,
            HTTPException: http_error,
            Exception: unexpected_error,
        },
        lifespan=lifespan,
    )
