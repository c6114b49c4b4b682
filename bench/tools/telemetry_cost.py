"""``python -m bench.tools.telemetry_cost [--attempts N] [--rounds R]``: what the telemetry
hooks cost per stage attempt, as ratios to an attempt without them. Each mode runs in a fresh
process: a stage with two durable steps through ``StageRunner.run`` against an
``InMemoryLedger`` (no database: the hooks' own cost, not diluted by I/O). Modes: ``absent``
(OpenTelemetry not importable), ``api`` (the API, no SDK: non-recording spans), ``sdk`` (SDK
with an in-memory exporter: 3 recorded spans per attempt), ``metrics`` (``EngineMetrics``
attached)."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

MODES = ("absent", "api", "sdk", "metrics")


def _child(mode: str, attempts: int) -> None:
    if mode in ("absent", "metrics"):
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    from pydantic import BaseModel

    from engine_port import (
        EngineMetrics,
        InMemoryLedger,
        Registry,
        StageContext,
        StageRequest,
        StageRunner,
        Workflow,
    )

    class In(BaseModel):
        n: int = 0

    wf = Workflow("bench-telemetry", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        return int(await ctx.step.run("one", lambda: 1)) + int(await ctx.step.run("two", lambda: 2))

    if mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)

    async def run() -> float:
        runner = StageRunner(Registry([wf]))
        if mode == "metrics":
            runner.metrics = EngineMetrics()
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        began = time.perf_counter()
        for i in range(attempts):
            req = StageRequest(f"r{i}", wf, "a", 1, {"n": 1}, trace_context=parent)
            await runner.run(req, InMemoryLedger())
        return (time.perf_counter() - began) / attempts

    print(asyncio.run(run()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attempts", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=MODES)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.attempts)
        return
    best: dict[str, float] = {}
    for _ in range(args.rounds):  # interleaved: a load spike hits every mode alike
        for mode in MODES:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.tools.telemetry_cost",
                    "--child",
                    mode,
                    "--attempts",
                    str(args.attempts),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            per = float(out.strip().splitlines()[-1])
            best[mode] = min(best.get(mode, per), per)
    base = best["absent"]
    for mode in MODES:
        print(f"{mode:8} {best[mode] * 1e6:8.1f} us/attempt  x{best[mode] / base:.2f}")


if __name__ == "__main__":
    main()
