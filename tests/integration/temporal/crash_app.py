"""A small app for the crash test (S17): run as a worker subprocess that hangs inside stage b
after step x when WFE_TEST_HANG is set, so the test can SIGKILL it there. WFE_TEST_LOCAL makes b
a ``local=True`` stage (a Temporal local activity). WFE_TEST_SIGNAL makes b, after step x, wait at
a file barrier (``at-barrier`` written, ``release`` awaited) and then for the signal "go".

Counts of stage/step bodies go to files in $WFE_TEST_COUNT_DIR (outside the engine); events
go to a JSON-lines file sink shared by every worker process.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from engine_port import EngineSettings, Event, FolderBlobStore, Registry, StageContext, Workflow


class In(BaseModel):
    n: int = 0


def count_dir() -> Path:
    return Path(os.environ["WFE_TEST_COUNT_DIR"])


def bump(name: str) -> None:
    with (count_dir() / f"count-{name}").open("a") as f:
        f.write("1\n")


def count(name: str) -> int:
    p = count_dir() / f"count-{name}"
    return len(p.read_text().splitlines()) if p.exists() else 0


class FileSink:
    """Appends events as JSON lines (shared by the worker subprocess and the test)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def publish(self, events: Sequence[Event]) -> None:
        with self.path.open("a") as f:
            for e in events:
                f.write(e.model_dump_json() + "\n")

    def events(self, run_id: str) -> list[Event]:
        seen: dict[str, Event] = {}
        for line in self.path.read_text().splitlines():
            e = Event.model_validate(json.loads(line))
            if e.run_id == run_id:
                seen.setdefault(e.id, e)
        return sorted(seen.values(), key=lambda e: e.seq)


def build_registry() -> Registry:
    wf = Workflow("crashy", input=In)

    @wf.stage
    async def a(ctx: StageContext[In]) -> int:
        bump("a")
        return 1

    @wf.stage(after=[a], local=bool(os.environ.get("WFE_TEST_LOCAL")))
    async def b(ctx: StageContext[In]) -> int:
        bump("b")

        def x() -> int:
            bump("x")
            return 10

        def y() -> int:
            bump("y")
            return 20

        vx = await ctx.step.run("x", x)
        got = 0
        if os.environ.get("WFE_TEST_SIGNAL"):
            # held at a file barrier until the test sent "go": the wait takes it from the run
            (count_dir() / "at-barrier").write_text("waiting")
            for _ in range(6000):  # another process opens it: poll the file (2 min at most)
                if (count_dir() / "release").exists():
                    break
                await asyncio.sleep(0.02)
            got = int((await ctx.step.wait_for_signal("go"))["n"])
        if os.environ.get("WFE_TEST_HANG"):
            (count_dir() / "in-b").write_text("hanging")
            await asyncio.sleep(600)
        vy = await ctx.step.run("y", y)
        return int(vx) + int(vy) + got

    @wf.stage(after=[b])
    async def c(ctx: StageContext[In]) -> int:
        bump("c")
        return int(ctx.output_of("b")) + 1

    return Registry([wf])


def settings_from_env() -> EngineSettings:
    return EngineSettings(driver="temporal")  # WFE_TEMPORAL_ADDRESS, WFE_TASK_QUEUE, ...


async def _main() -> None:
    from driver_temporal import create_temporal_engine, run_worker_forever

    settings = settings_from_env()
    engine = create_temporal_engine(
        settings,
        build_registry(),
        event_sink=FileSink(count_dir() / "events.jsonl"),
        blob_store=FolderBlobStore(settings.blob_url.reveal().removeprefix("file://")),
        heartbeat_timeout=2.0,
    )
    await run_worker_forever(engine, sticky_queue_timeout=2.0)


if __name__ == "__main__":
    asyncio.run(_main())
