"""``wfe demo``: an order workflow with parallel stages, a durable step, a
sleep, a signal and a compensation, run twice on the configured engine (embedded SQLite by
default): once to completion, once with a forced failure that is compensated."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from engine_port import (
    EngineSettings,
    MemorySink,
    Registry,
    Retry,
    RunInfo,
    StageContext,
    Workflow,
    create_engine,
)
from engine_port.errors import NonRetryableError

from ._errors import run_sync
from ._options import settings
from ._output import console

__all__ = ["build_demo", "demo", "run_demo"]


class OrderIn(BaseModel):
    order_id: str
    total: float
    fail_shipping: bool = False


class Reservation(BaseModel):
    order_id: str
    items: int


def build_demo() -> Registry:
    order = Workflow("demo-order", input=OrderIn, hooks=["order.charged"])
    quick = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=50))

    @order.stage(retry=quick)
    async def reserve(ctx: StageContext[OrderIn]) -> Reservation:
        return Reservation(order_id=ctx.input.order_id, items=3)

    @reserve.compensation
    async def release(ctx: StageContext[OrderIn], output: Reservation) -> None:
        ctx.log.info("released %s items of %s", output.items, output.order_id)

    @order.stage(after=[reserve])
    async def fraud_check(ctx: StageContext[OrderIn]) -> str:
        return "ok"

    @order.stage(after=[reserve])
    def price(ctx: StageContext[OrderIn]) -> float:  # a sync stage, run in a thread
        return round(ctx.input.total * 1.2, 2)

    # declared signals: engine.signal refuses other names, and the Temporal Web UI lists it
    @order.stage(after=[fraud_check, price], signals=["approval"])
    async def approve(ctx: StageContext[OrderIn]) -> dict[str, Any]:
        decision: dict[str, Any] = await ctx.step.wait_for_signal(
            "approval", timeout=timedelta(minutes=5)
        )
        return decision

    @order.stage(after=[approve], retry=quick)
    async def charge(ctx: StageContext[OrderIn]) -> dict[str, Any]:
        amount = ctx.output_of(price)

        def charge_card() -> str:
            return f"txn-{ctx.input.order_id}"

        txn = await ctx.step.run("charge-card", charge_card)
        await ctx.step.sleep("settle", timedelta(milliseconds=300))
        ctx.emit("order.charged", {"order_id": ctx.input.order_id, "amount": amount})
        await ctx.hook("order.charged", {"txn": txn})
        return {"txn": txn, "amount": amount}

    @charge.compensation
    async def refund(ctx: StageContext[OrderIn], output: dict[str, Any]) -> None:
        ctx.log.info("refunded %s", output["txn"])

    @order.stage(after=[charge])
    async def ship(ctx: StageContext[OrderIn]) -> str:
        if ctx.input.fail_shipping:
            raise NonRetryableError("the carrier rejected the parcel")
        return "shipped"

    registry = Registry([order])
    registry.register_hook(
        "order.charged", lambda ctx, payload: f"emailed {payload['txn']}", name="email-receipt"
    )
    return registry


def _print_run(console: Console, info: RunInfo, sink: MemorySink) -> None:
    console.rule(f"run {info.id} - {info.status.value}")
    table = Table("stage", "status", "attempt", "output / error")
    for s in info.stages:
        detail = s.error.message if s.error else s.output
        table.add_row(s.id, s.status.value, str(s.attempt), str(detail))
    console.print(table)
    if info.error:
        console.print(f"error: {info.error.type} in {info.error.stage}: {info.error.message}")
    events = Table("seq", "event", "stage", "data")
    for e in sink.for_run(info.id):
        events.add_row(str(e.seq), e.type, e.stage or "", str(e.data) if e.data else "")
    console.print(events)


def _where(settings: EngineSettings) -> str:
    """What the demo runs on: the database only for the native driver (the Temporal driver
    never opens it, and the memory driver's is a throwaway file: both said "on sqlite:///...")."""
    if settings.driver == "native":
        return f"native on {settings.database_url.redacted()}"
    if settings.driver == "temporal":
        return f"temporal at {settings.temporal_address} (namespace {settings.temporal_namespace})"
    if settings.driver == "memory":
        return "memory (a throwaway store: nothing outlives the demo)"
    return settings.driver


async def run_demo(settings: EngineSettings, console: Console) -> None:
    sink = MemorySink()
    registry = build_demo()
    async with create_engine(settings, registry, event_sink=sink) as engine, engine.worker():
        console.print(f"engine: {_where(settings)}")
        ok = await engine.start("demo-order", {"order_id": "A-1", "total": 100.0})
        bad = await engine.start(
            "demo-order", {"order_id": "B-2", "total": 5.0, "fail_shipping": True}
        )
        for run in (ok, bad):
            while (await engine.get_run(run.id)).status != "suspended":  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            console.print(f"{run.id} waits for signal 'approval'; sending it")
            await engine.signal(run.id, "approval", {"approved_by": "demo"})
        for run in (ok, bad):
            info = await engine.wait(run.id, timeout=60)
            terminal = "run.completed" if info.status == "completed" else "run.failed"
            while not any(e.type == terminal for e in sink.for_run(run.id)):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            _print_run(console, info, sink)


def demo(
    database_url: Annotated[
        str | None, typer.Option(help="defaults to the embedded SQLite")
    ] = None,
) -> None:
    """Run the demo workflow on the embedded default and print its run and events."""
    run_sync(run_demo(settings(database_url=database_url), console))
