"""``python -m bench.tools.timer_lateness [sqlite|postgres|both] [--runs N] [--sleep-ms D]
[--poll S] [--retry]``: how late a durable timer fires on the native driver (in-process
worker). Runs N runs one after the other, each of one stage that sleeps D ms
(``ctx.step.sleep``), or with ``--retry`` that fails once with a retry delay of D ms, and
prints the p50/p95 of

- the lateness: when the stage body ran again minus when it was due (the sleep's deadline,
  taken as the body's clock just before the sleep plus D: the engine's own deadline is a few
  microseconds later; with ``--retry``: the body's clock when it raised plus D, which the
  engine's is later than by the record of the failure, so it over-states by that);
- the run latency minus D (start -> ``wait()`` returns).

``--poll``: the worker's ``poll_interval_seconds`` (default: the setting's default); a timer
that only the poll finds is up to that late."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import timedelta

from pydantic import BaseModel

from engine_port import EngineSettings, Registry, Retry, StageContext, Workflow, create_engine

from .._common import native_database, pct


class _In(BaseModel):
    ms: float = 1.0


class _Marks:
    """When each run's stage body first ran (and was due again), and when it ran again."""

    def __init__(self) -> None:
        self.due: dict[str, float] = {}
        self.again: dict[str, float] = {}

    def seen(self, run_id: str) -> bool:
        """Note the body's execution: whether it is the first of the run."""
        if run_id in self.due:
            self.again.setdefault(run_id, time.time())
            return False
        return True


def _workflows(marks: _Marks, delay_ms: float) -> Registry:
    sleeper = Workflow("lateness-sleep", input=_In)

    @sleeper.stage
    async def nap(ctx: StageContext[_In]) -> int:
        if marks.seen(ctx.run_id):
            marks.due[ctx.run_id] = time.time() + ctx.input.ms / 1000
        await ctx.step.sleep("nap", timedelta(milliseconds=ctx.input.ms))
        return 1

    retrier = Workflow("lateness-retry", input=_In)
    retry = Retry(max_attempts=2, initial_interval=timedelta(milliseconds=delay_ms), backoff=1.0)

    @retrier.stage(retry=retry)
    async def flaky(ctx: StageContext[_In]) -> int:
        if marks.seen(ctx.run_id):
            marks.due[ctx.run_id] = time.time() + ctx.input.ms / 1000
            raise RuntimeError("fails once")
        return 1

    return Registry([sleeper, retrier])


async def _measure(
    backend: str, runs: int, delay_ms: float, poll: float | None, retry: bool
) -> tuple[list[float], list[float]]:
    """(lateness, run latency minus D) of each run, in seconds."""
    marks = _Marks()
    with native_database(backend) as url, tempfile.TemporaryDirectory() as blobs:
        settings = EngineSettings(database_url=url, blob_url=f"file://{blobs}")
        if poll is not None:
            settings = settings.model_copy(update={"poll_interval_seconds": poll})
        wf = "lateness-retry" if retry else "lateness-sleep"
        engine = create_engine(settings, _workflows(marks, delay_ms))
        async with engine, engine.worker():
            for _ in range(3):  # warm-up
                run = await engine.start(wf, {"ms": delay_ms})
                await engine.wait(run.id, timeout=120)
            late, extra_s = [], []
            for _ in range(runs):
                t0 = time.perf_counter()
                run = await engine.start(wf, {"ms": delay_ms})
                info = await engine.wait(run.id, timeout=120)
                took = time.perf_counter() - t0
                if info.status != "completed":
                    raise SystemExit(f"run {run.id} ended {info.status}")
                late.append(marks.again[run.id] - marks.due[run.id])
                extra_s.append(took - delay_ms / 1000)
    return late, extra_s


def _line(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"  {name:<28} p50 {pct(ms, 50):8.1f} ms   p95 {pct(ms, 95):8.1f} ms   "
        f"mean {statistics.fmean(ms):8.1f} ms"
    )


async def main(
    backends: list[str], runs: int, delay_ms: float, poll: float | None, retry: bool
) -> None:
    what = f"retry delay {delay_ms:g} ms" if retry else f"ctx.step.sleep {delay_ms:g} ms"
    shown = "default" if poll is None else f"{poll:g} s"
    for backend in backends:
        late, extra_s = await _measure(backend, runs, delay_ms, poll, retry)
        print(f"{backend}: {runs} sequential runs, one stage, {what}, poll interval {shown}")
        print(_line("resume - due", late))
        print(_line("run latency - D", extra_s))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("backend", nargs="?", default="both", choices=["sqlite", "postgres", "both"])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--sleep-ms", type=float, default=100.0, help="D: the sleep (or retry delay)")
    ap.add_argument("--poll", type=float, default=None, help="poll_interval_seconds")
    ap.add_argument("--retry", action="store_true", help="a retry delay instead of a sleep")
    args = ap.parse_args()
    chosen = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    asyncio.run(main(chosen, args.runs, args.sleep_ms, args.poll, args.retry))
