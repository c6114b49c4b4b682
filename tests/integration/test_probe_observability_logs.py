"""Probe: ``wfe worker --log-format json`` keeps one JSON object per stderr line when a stage
(or a library) emits a Python warning, and the format name is case-insensitive like the
level's."""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from engine_port.errors import WaitTimeoutError

from .test_worker_logs import json_worker


class In(BaseModel):
    n: int = 0


def build() -> Registry:
    wf = Workflow("probe-warns", input=In, version="v1")

    @wf.stage
    async def noisy(ctx: StageContext[In]) -> int:
        warnings.warn("probe: this API is going away", RuntimeWarning, stacklevel=1)
        return 1

    return Registry([wf])


def test_json_logs_stay_json_when_a_stage_warns(tmp_path: Path) -> None:
    proc, env = json_worker(
        tmp_path, "tests.integration.test_probe_observability_logs:build", "JSON"
    )
    try:

        async def start() -> str:
            settings = EngineSettings(
                database_url=env["WFE_DATABASE_URL"], blob_url=env["WFE_BLOB_URL"]
            )
            async with create_engine(settings, build()) as engine:
                run = await engine.start("probe-warns", {})
                deadline = time.monotonic() + 90
                while True:
                    assert proc.poll() is None, "the worker exited"
                    try:
                        info = await engine.wait(run.id, timeout=0.5)
                    except WaitTimeoutError:
                        assert time.monotonic() < deadline, "the run never completed"
                        continue
                    assert info.status == "completed"
                    return run.id

        run_id = asyncio.run(start())
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        docs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "the worker exited"
            try:
                doc = json.loads(line)
            except ValueError:
                raise AssertionError(f"not a JSON line on stderr: {line!r}") from None
            assert isinstance(doc, dict)
            docs.append(doc)
            if doc.get("wfe_run_id") == run_id and doc["message"].endswith("stage completed"):
                break
        else:
            raise AssertionError("the stage's completion was never logged")
        warned = [d for d in docs if "this API is going away" in d["message"]]
        assert warned and warned[0]["logger"] == "py.warnings"
        assert warned[0]["level"] == "WARNING"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
