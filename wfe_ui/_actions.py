"""The actions of the web view (POST, only with ``--allow-actions``): signal, cancel and
redrive a run; replay dead letters and flush the outbox."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from engine_port.errors import EngineError

from ._context import UiContext, quote_path, status_code
from ._inputs import BadRequestError, check_name, check_run_id, check_submission, parse_payload
from ._pages import render_run

__all__ = ["action_routes"]


async def _checked_form(ctx: UiContext, request: Request) -> Any:
    """The form of a POST that may change state: only with --allow-actions, from a page of
    this server (same origin) carrying its CSRF token."""
    if not ctx.allow_actions:
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
    try:
        form = await request.form()
    except HTTPException as exc:  # Starlette's limits: 1 MiB a field, 1,000 fields
        raise HTTPException(
            exc.status_code,
            f"the form could not be read ({exc.detail}); send it from the page's own form "
            "(a signal payload sent from this page can be at most 1 MiB)",
        ) from None
    token = form.get("csrf")
    if not isinstance(token, str) or not hmac.compare_digest(token, ctx.csrf):
        raise HTTPException(403, "the form's token is missing or stale; reload the page")
    return form


def _field(form: Any, name: str) -> str:
    value = form.get(name, "")
    if not isinstance(value, str):  # a file upload: never read as an empty field
        raise BadRequestError(f"{name} must be a text field, not a file upload")
    return value


async def _act(
    ctx: UiContext,
    request: Request,
    run_id: str,
    action: Callable[[], Awaitable[str]],
    signal_form: dict[str, str] | None = None,
) -> Response:
    """Run ``action`` on the run; back to its page with what was done, or the page again
    with why it was refused (and the signal form as the user filled it)."""
    try:
        done = await action()
    except EngineError as exc:
        code = status_code(exc)
        if code in (404, 503):
            raise
        return await render_run(
            ctx, request, run_id, 0, None, str(exc), code, signal_form=signal_form
        )
    return RedirectResponse(
        f"/runs/{quote_path(run_id)}?{urlencode({'done': done})}", status_code=303
    )


def action_routes(ctx: UiContext) -> list[Route]:
    engine = ctx.engine

    async def signal(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        form = await _checked_form(ctx, request)
        typed = {f: _field(form, f) for f in ("name", "payload", "idempotency_key")}

        async def send() -> str:
            name = check_name(typed["name"].strip(), "the signal name")
            payload = parse_payload(typed["payload"])
            key = typed["idempotency_key"].strip() or None
            if key is not None:
                check_name(key, "the idempotency key", 300)
            else:
                # one rendered form sends one signal: a double click (or a resubmission
                # of the same page) repeats the form's token and is not queued again
                submission = check_submission(_field(form, "submission"))
                key = f"ui-form-{submission}" if submission else None
            result = await engine.signal(run_id, name, payload, idempotency_key=key)
            if result.already_completed:
                return "signal-repeat" if typed["idempotency_key"].strip() else "signal-resent"
            return "signal-delivered" if result.delivered else "signal-buffered"

        return await _act(ctx, request, run_id, send, typed)

    async def cancel(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        await _checked_form(ctx, request)

        async def do() -> str:
            await engine.cancel(run_id)
            return "cancelled"

        return await _act(ctx, request, run_id, do)

    async def redrive(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        form = await _checked_form(ctx, request)

        async def do() -> str:
            from_ = check_name(_field(form, "from").strip() or "last_failure", "from")
            version = _field(form, "version").strip() or None
            if version is not None and version != "latest":
                raise BadRequestError("version must be empty (keep it) or latest")
            await engine.redrive(run_id, from_, version=version)
            return "redriven"

        return await _act(ctx, request, run_id, do)

    async def outbox_action(request: Request) -> Response:
        await _checked_form(ctx, request)
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
        return ctx.page(
            request, "outbox.html", counts=counts, message=None, result=result, title="Outbox"
        )

    return [
        Route("/runs/{run_id}/signal", signal, methods=["POST"]),
        Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
        Route("/runs/{run_id}/redrive", redrive, methods=["POST"]),
        Route("/outbox/{what}", outbox_action, methods=["POST"]),
    ]
