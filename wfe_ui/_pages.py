"""The pages of the web view (GET): runs list, one run, a run's values, versions, outbox."""

from __future__ import annotations

import secrets
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from engine_port import RunInfo
from engine_port.errors import InvalidInputError, RunNotFoundError

from ._context import UiContext, takes_filters
from ._inputs import (
    BadRequestError,
    RunFilter,
    check_name,
    check_run_id,
    parse_run_filter,
    refresh_seconds,
)
from ._views import graph_for, layout, preview, timeline, waiting

__all__ = ["DONE", "SCAN_LIMIT", "page_routes", "render_run"]

SCAN_LIMIT = 500  # runs read to apply the filters the port cannot apply itself
DONE = {
    "signal-delivered": "Signal delivered to the step waiting for it.",
    "signal-buffered": "Signal queued: the next wait for that name takes it.",
    "signal-repeat": "That idempotency key was seen before: the signal was not queued again.",
    "signal-resent": (
        "This form was sent before (a double click?): the signal was not sent again. "
        "Send another one from the form below."
    ),
    "cancelled": "Run cancelled (completed stages are compensated).",
    "redriven": "Run redriven: a worker serving its version runs it.",
    "replayed": "Dead letters queued for delivery again.",
    "flushed": "Pending events delivered to the sink.",
}


def page_routes(ctx: UiContext) -> list[Route]:
    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=307)

    async def runs(request: Request) -> Response:
        return await _runs(ctx, request)

    async def run_page(request: Request) -> Response:
        run_id = check_run_id(request.path_params["run_id"])
        refresh = refresh_seconds(request.query_params.get("refresh"), 0)
        done = request.query_params.get("done")
        return await render_run(ctx, request, run_id, refresh, DONE.get(done or ""), None, 200)

    async def run_value(request: Request) -> Response:
        return await _run_value(ctx, request)

    async def versions(request: Request) -> Response:
        found = await ctx.engine.list_versions()
        stranded = [v for v in found if v.active_runs > 0 and not v.served_here]
        return ctx.page(
            request, "versions.html", versions=found, stranded=stranded, title="Versions"
        )

    async def outbox(request: Request) -> Response:
        counts = None
        method = getattr(ctx.engine, "outbox_counts", None)
        if method is not None:
            counts = await method()
        done = request.query_params.get("done")
        return ctx.page(
            request,
            "outbox.html",
            counts=counts,
            message=DONE.get(done or ""),
            result=None,
            title="Outbox",
        )

    return [
        Route("/", home),
        Route("/runs", runs),
        Route("/runs/{run_id}", run_page),
        Route("/runs/{run_id}/value", run_value),
        Route("/versions", versions),
        Route("/outbox", outbox),
    ]


async def _list_runs(
    ctx: UiContext, flt: RunFilter, cutoff: datetime | None, paged: Any, filtered: bool
) -> tuple[list[RunInfo], list[RunInfo], str | None]:
    """The runs the list shows before the view's own filtering: (found by search, listed,
    the cursor of the next page)."""
    engine = ctx.engine
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
        common: dict[str, Any] = dict(
            workflow_id=flt.workflow,
            status=statuses,
            version=flt.version,
            created_after=cutoff,
            outputs=False,
        )
        listed, cursor = await paged(**common, id_prefix=flt.q, limit=flt.limit, after=flt.after)
        if flt.q is not None and flt.after is None:
            by_key, _ = await paged(**common, idempotency_key=flt.q, limit=1)
            candidates.extend(by_key)
        return candidates, listed, cursor
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
    return candidates, listed, cursor


async def _runs(ctx: UiContext, request: Request) -> Response:
    flt = parse_run_filter(request.query_params)
    cutoff = None
    if flt.since_delta:
        # the first page takes it from the clock; the next ones keep it (their cursor is
        # good only for the same listing)
        fixed = flt.cutoff if flt.after is not None else None
        cutoff = fixed or datetime.now(UTC) - flt.since_delta
    paged = getattr(ctx.engine, "list_runs_page", None)
    filtered = paged is not None and takes_filters(paged)
    narrowed = not filtered and (
        flt.version is not None or flt.since_seconds is not None or flt.q is not None
    )
    candidates, listed, cursor = await _list_runs(ctx, flt, cutoff, paged, filtered)

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
    return ctx.page(
        request,
        "runs.html",
        runs=shown,
        flt=flt,
        narrowed=narrowed,
        scanned=len(listed),
        scan_limit=SCAN_LIMIT,
        cursor=cursor,
        cutoff=cutoff,
        paged=paged is not None and not narrowed,
        more=len(found) > flt.limit or (not narrowed and len(listed) >= flt.limit),
        refresh=flt.refresh,
        title="Runs",
    )


async def render_run(
    ctx: UiContext,
    request: Request,
    run_id: str,
    refresh: int,
    message: str | None,
    problem: str | None,
    status_code: int,
    signal_form: dict[str, str] | None = None,
) -> Response:
    """One run's page (also after an action, with what it did or why it was refused, and
    the signal form as it was filled in)."""
    # spilled values stay in the blob store until asked for (a link to /value)
    lazy = getattr(ctx.engine, "get_run_lazy", None)
    spilled: dict[str, int] = {}
    if lazy is not None:
        info, spilled = await lazy(run_id)
    else:
        info = await ctx.engine.get_run(run_id)
    events, events_problem = await ctx.events_of(run_id)
    graph = graph_for(ctx.registry, info)
    stages = []
    for s in info.stages:
        text, cut = preview(s.output) if s.output is not None else ("", False)
        stages.append((s, text, cut, spilled.get(f"stage:{s.id}")))
    input_text, input_cut = preview(info.input)
    output_text, output_cut = preview(info.output)
    output_spilled = sum(v for k, v in spilled.items() if k.startswith("output:"))
    waits = waiting(info.stages)
    return ctx.page(
        request,
        "run.html",
        status_code=status_code,
        history_url=ctx.temporal_history(info.id),
        run=info,
        active=not info.terminal,
        graph=layout(info, graph),
        timeline=timeline(info, events),
        events=events,
        events_problem=events_problem,
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
        signal_form=signal_form,
        submission=secrets.token_urlsafe(18),
        refresh=refresh,
        title=f"Run {info.id}",
    )


async def _run_value(ctx: UiContext, request: Request) -> Response:
    """A run's input, output or one stage's output in full, as JSON (spilled values are
    read from the blob store by the driver)."""
    run_id = check_run_id(request.path_params["run_id"])
    what = request.query_params.get("what", "")
    info = await ctx.engine.get_run(run_id)
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
