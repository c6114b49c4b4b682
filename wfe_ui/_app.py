"""The Starlette application behind ``wfe ui``: server-rendered pages over the engine port."""

from __future__ import annotations

import hmac
import inspect
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from engine_port import (
    Event,
    Registry,
    RunInfo,
    RunStatus,
    WorkflowEngine,
)
from engine_port.errors import (
    DriverUnavailableError,
    EngineError,
    InvalidInputError,
    RunNotFoundError,
    UnsupportedFeatureError,
    WorkflowNotFoundError,
)

from ._inputs import (
    LIMITS,
    REFRESH_SECONDS,
    BadRequestError,
    check_name,
    check_run_id,
    parse_payload,
    parse_run_filter,
    refresh_seconds,
)
from ._views import graph_for, layout, preview, timeline, waiting

__all__ = ["create_app"]

_HERE = Path(__file__).parent
SCAN_LIMIT = 500  # runs read to apply the filters the port cannot apply itself
_DONE = {
    "signal-delivered": "Signal delivered to the step waiting for it.",
    "signal-buffered": "Signal queued: the next wait for that name takes it.",
    "signal-repeat": "That idempotency key was seen before: the signal was not queued again.",
    "cancelled": "Run cancelled (completed stages are compensated).",
    "redriven": "Run redriven: a worker serving its version runs it.",
    "replayed": "Dead letters queued for delivery again.",
    "flushed": "Pending events delivered to the sink.",
}
_STATUS_CODES: tuple[tuple[type[EngineError], int], ...] = (
    (RunNotFoundError, 404),
    (WorkflowNotFoundError, 404),
    (InvalidInputError, 400),
    (UnsupportedFeatureError, 501),
    (DriverUnavailableError, 503),
)
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


def _when(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _when_ms(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _status_code(exc: EngineError) -> int:
    for kind, code in _STATUS_CODES:
        if isinstance(exc, kind):
            return code
    return 409  # an engine error is one a user can cause: the request does not fit the state


def create_app(  # noqa: PLR0915  route closures; wfe_ui is being extended (helper ui); split after
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
    registry = registry if registry is not None else engine.registry
    csrf = secrets.token_urlsafe(32)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = _when
    env.filters["path"] = _quote
    env.filters["when_ms"] = _when_ms
    env.globals.update(
        allow_actions=allow_actions,
        csrf=csrf,
        driver=engine.driver_name,
        statuses=[s.value for s in RunStatus],
        limits=LIMITS,
        refreshes=REFRESH_SECONDS,
        urlencode=lambda q: urlencode(q, doseq=True),
    )
    templates = Jinja2Templates(env=env)

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        context.setdefault("refresh", 0)
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    async def events_of(run_id: str) -> list[Event] | None:
        """The run's event stream, where the driver offers one (the native driver does)."""
        method = getattr(engine, "events", None)
        if method is None:
            return None
        found: list[Event] = await method(run_id)
        return found

    # -- pages -----------------------------------------------------------------------------
    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=307)

    async def runs(request: Request) -> Response:
        flt = parse_run_filter(request.query_params)
        cutoff = datetime.now(UTC) - flt.since_delta if flt.since_delta else None
        paged = getattr(engine, "list_runs_page", None)
        filtered = paged is not None and _takes_filters(paged)
        narrowed = not filtered and (
            flt.version is not None or flt.since_seconds is not None or flt.q is not None
        )
        statuses = list(flt.statuses) or None
        candidates: list[RunInfo] = []
        cursor: str | None = None
        if filtered:
            # the driver applies every filter itself (in the database on the native driver,
            # in the visibility query on Temporal): a match behind any number of newer runs
            # is found, and each page is one query
            assert paged is not None
            common: dict[str, Any] = dict(
                workflow_id=flt.workflow,
                status=statuses,
                version=flt.version,
                created_after=cutoff,
                outputs=False,
            )
            listed, cursor = await paged(
                **common, id_prefix=flt.q, limit=flt.limit, after=flt.after
            )
            if flt.q is not None and flt.after is None:
                by_key, _ = await paged(**common, idempotency_key=flt.q, limit=1)
                candidates.extend(by_key)
        else:
            if flt.q is not None and len(flt.q) <= 64:
                with suppress(RunNotFoundError, InvalidInputError):
                    candidates.append(await engine.get_run(flt.q))
            if paged is not None and not narrowed:
                listed, cursor = await paged(
                    workflow_id=flt.workflow, status=statuses, limit=flt.limit, after=flt.after
                )
            else:
                listed = await engine.list_runs(
                    workflow_id=flt.workflow,
                    status=statuses,
                    limit=SCAN_LIMIT if narrowed else flt.limit,
                    outputs=False,
                )

        def wanted(r: RunInfo) -> bool:
            return (
                (flt.workflow is None or r.workflow_id == flt.workflow)
                and (not flt.statuses or r.status in flt.statuses)
                and (flt.version is None or r.version == flt.version)
                and (cutoff is None or (r.created_at is not None and r.created_at >= cutoff))
                and (flt.q is None or r.id.startswith(flt.q) or r.idempotency_key == flt.q)
            )

        found = [r for r in dict((r.id, r) for r in [*candidates, *listed]).values() if wanted(r)]
        # a run found by its idempotency key comes on top of a full page (never cut: the
        # cursor continues after the last run of the page)
        shown = found if filtered else found[: flt.limit]
        return page(
            request,
            "runs.html",
            runs=shown,
            flt=flt,
            narrowed=narrowed,
            scanned=len(listed),
            scan_limit=SCAN_LIMIT,
            cursor=cursor,
            paged=paged is not None and not narrowed,
            more=len(found) > flt.limit or (not narrowed and len(listed) >= flt.limit),
            refresh=flt.refresh,
            title="Runs",
        )

    async def run_page(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        refresh = refresh_seconds(request.query_params.get("refresh"), 0)
        done = request.query_params.get("done")
        return await _run_page(request, run_id, refresh, _DONE.get(done or ""), None, 200)

    async def _run_page(
        request: Request,
        run_id: str,
        refresh: int,
        message: str | None,
        problem: str | None,
        status_code: int,
    ) -> Response:
        # spilled values stay in the blob store until asked for (a link to /value)
        lazy = getattr(engine, "get_run_lazy", None)
        spilled: dict[str, int] = {}
        if lazy is not None:
            info, spilled = await lazy(run_id)
        else:
            info = await engine.get_run(run_id)
        events = await events_of(run_id)
        graph = graph_for(registry, info)
        stages = []
        for s in info.stages:
            text, cut = preview(s.output) if s.output is not None else ("", False)
            stages.append((s, text, cut, spilled.get(f"stage:{s.id}")))
        input_text, input_cut = preview(info.input)
        output_text, output_cut = preview(info.output)
        output_spilled = sum(v for k, v in spilled.items() if k.startswith("output:"))
        waits = waiting(info.stages)
        return page(
            request,
            "run.html",
            status_code=status_code,
            history_url=_temporal_history(engine, info.id),
            run=info,
            active=not info.terminal,
            graph=layout(info, graph),
            timeline=timeline(info, events),
            events=events,
            stages=stages,
            input_text=input_text,
            input_cut=input_cut,
            output_text=output_text,
            output_cut=output_cut,
            input_spilled=spilled.get("input"),
            output_spilled=output_spilled or None,
            waits=waits,
            signal_names=sorted({w.name for w in waits if w.kind == "signal"}),
            redrive_from=["last_failure", "start", *(s.id for s in info.stages)],
            message=message,
            problem=problem,
            refresh=refresh,
            title=f"Run {info.id}",
        )

    async def run_value(request: Request) -> Response:
        """A run's input, output or one stage's output in full, as JSON (spilled values are
        read from the blob store by the driver)."""
        run_id = check_run_id(request.path_params["run_id"])
        what = request.query_params.get("what", "")
        info = await engine.get_run(run_id)
        if what == "input":
            return JSONResponse(info.input)
        if what == "output":
            return JSONResponse(info.output)
        if what == "stage":
            stage = check_name(request.query_params.get("stage", ""), "stage", 200)
            try:
                return JSONResponse(info.stage(stage).output)
            except KeyError:
                raise HTTPException(404, f"run {run_id} has no stage {stage!r}") from None
        raise BadRequestError("what must be input, output or stage (with stage=ID)")

    async def versions(request: Request) -> Response:
        found = await engine.list_versions()
        stranded = [v for v in found if v.active_runs > 0 and not v.served_here]
        return page(request, "versions.html", versions=found, stranded=stranded, title="Versions")

    async def outbox(request: Request) -> Response:
        counts = None
        method = getattr(engine, "outbox_counts", None)
        if method is not None:
            counts = await method()
        done = request.query_params.get("done")
        return page(
            request,
            "outbox.html",
            counts=counts,
            message=_DONE.get(done or ""),
            result=None,
            title="Outbox",
        )

    # -- actions -----------------------------------------------------------------------------
    async def checked_form(request: Request) -> Any:
        """The form of a POST that may change state: only with --allow-actions, from a page of
        this server (same origin) carrying its CSRF token."""
        if not allow_actions:
            raise HTTPException(
                403, "this web view is read-only; start it with 'wfe ui --allow-actions'"
            )
        site = request.headers.get("sec-fetch-site")
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if site is not None and site not in ("same-origin", "none"):
            raise HTTPException(403, "cross-site requests are refused")
        if origin is not None and origin != "null" and urlsplit(origin).netloc != host:
            raise HTTPException(403, "requests from another origin are refused")
        form = await request.form()
        token = form.get("csrf")
        if not isinstance(token, str) or not hmac.compare_digest(token, csrf):
            raise HTTPException(403, "the form's token is missing or stale; reload the page")
        return form

    def field(form: Any, name: str) -> str:
        value = form.get(name, "")
        return value if isinstance(value, str) else ""

    def back(run_id: str, done: str) -> Response:
        return RedirectResponse(
            f"/runs/{_quote(run_id)}?{urlencode({'done': done})}", status_code=303
        )

    async def act(request: Request, run_id: str, action: Callable[[], Awaitable[str]]) -> Response:
        try:
            done = await action()
        except EngineError as exc:
            code = _status_code(exc)
            if code in (404, 503):
                raise
            return await _run_page(request, run_id, 0, None, str(exc), code)
        return back(run_id, done)

    async def signal(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        form = await checked_form(request)

        async def send() -> str:
            name = check_name(field(form, "name").strip(), "the signal name")
            payload = parse_payload(field(form, "payload"))
            key = field(form, "idempotency_key").strip() or None
            if key is not None:
                check_name(key, "the idempotency key", 300)
            result = await engine.signal(run_id, name, payload, idempotency_key=key)
            if result.already_completed:
                return "signal-repeat"
            return "signal-delivered" if result.delivered else "signal-buffered"

        return await act(request, run_id, send)

    async def cancel(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        await checked_form(request)

        async def do() -> str:
            await engine.cancel(run_id)
            return "cancelled"

        return await act(request, run_id, do)

    async def redrive(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        form = await checked_form(request)

        async def do() -> str:
            from_ = check_name(field(form, "from").strip() or "last_failure", "from")
            version = field(form, "version").strip() or None
            if version is not None and version != "latest":
                raise BadRequestError("version must be empty (keep it) or latest")
            await engine.redrive(run_id, from_, version=version)
            return "redriven"

        return await act(request, run_id, do)

    async def outbox_action(request: Request) -> Response:
        await checked_form(request)
        what = request.path_params["what"]
        if what == "replay":
            count = await engine.replay_dlq()
            result = f"{count} dead-lettered event(s) queued for delivery again."
        elif what == "flush":
            flushed = await engine.flush_events()
            result = (
                f"delivered {flushed.published}, failed {flushed.failed}, "
                f"dead-lettered {flushed.dead_lettered}"
                + (
                    f" (the sink is failing: {flushed.sink_error or 'no error given'})"
                    if flushed.sink_status == "degraded"
                    else ""
                )
            )
        else:
            raise HTTPException(404, "no such outbox action")
        method = getattr(engine, "outbox_counts", None)
        counts = await method() if method is not None else None
        return page(
            request, "outbox.html", counts=counts, message=None, result=result, title="Outbox"
        )

    # -- errors ---------------------------------------------------------------------------
    async def engine_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngineError)
        code = _status_code(exc)
        return page(request, "error.html", status_code=code, problem=str(exc), title="Error")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return page(
            request, "error.html", status_code=exc.status_code, problem=exc.detail, title="Error"
        )

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
    return Starlette(
        routes=[
            Route("/", home),
            Route("/runs", runs),
            Route("/runs/{run_id}", run_page),
            Route("/runs/{run_id}/value", run_value),
            Route("/runs/{run_id}/signal", signal, methods=["POST"]),
            Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
            Route("/runs/{run_id}/redrive", redrive, methods=["POST"]),
            Route("/versions", versions),
            Route("/outbox", outbox),
            Route("/outbox/{what}", outbox_action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ],
        middleware=middleware,
        exception_handlers={EngineError: engine_error, HTTPException: http_error},
        lifespan=lifespan,
    )


def _temporal_history(engine: WorkflowEngine, run_id: str) -> str | None:
    """The run in the Temporal Web UI (``temporal_ui_url`` in the settings), for a run of
    the Temporal driver: its history is the event stream there."""
    if engine.driver_name != "temporal":
        return None
    settings = getattr(engine, "settings", None)
    base = getattr(settings, "temporal_ui_url", None)
    if not isinstance(base, str) or not base.startswith(("http://", "https://")):
        return None
    namespace = getattr(settings, "temporal_namespace", "default")
    query = urlencode({"query": f'WorkflowId="{run_id}"'})
    return f"{base.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows?{query}"


_PAGE_FILTERS = ("version", "created_after", "id_prefix", "idempotency_key", "outputs")


def _takes_filters(method: Callable[..., Any]) -> bool:
    """Whether a driver's ``list_runs_page`` applies every filter of the runs list itself
    (the native and Temporal drivers do); else the view filters the newest runs it reads."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return all(name in params for name in _PAGE_FILTERS)


def _quote(run_id: str) -> str:
    return quote(run_id, safe="")
