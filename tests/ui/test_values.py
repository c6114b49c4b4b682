"""Claim-checked values on the run page: a spilled value is read from the blob store only when
asked for (its link), never on every load of the page (issue 18)."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from starlette.testclient import TestClient

from engine_port import EngineSettings, Registry, StageContext, Workflow, create_engine
from wfe_ui import create_app

BIG = "x" * 400  # over the 100-byte threshold below: spilled to the blob store


class In(BaseModel):
    note: str


def registry() -> Registry:
    wf: Workflow[In] = Workflow("spilly", input=In, version="1")

    @wf.stage
    async def big(ctx: StageContext[In]) -> str:
        return BIG

    @wf.stage  # two sinks: the run's output is {"big": ..., "small": 7}
    async def small(ctx: StageContext[In]) -> int:
        return 7

    return Registry([wf])


@pytest.fixture(params=["sqlite", pytest.param("temporal", marks=pytest.mark.temporal)])
def driver(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "sqlite":
        return {}
    server: Any = request.getfixturevalue("temporal_server")
    return {
        "driver": "temporal",
        "temporal_address": server.address,
        "task_queue": f"uiv-{uuid.uuid4().hex[:10]}",
    }


def test_the_run_page_reads_no_spilled_value_and_links_to_each(
    tmp_path: Path, driver: dict[str, Any]
) -> None:
    blobs = tmp_path / "blobs"
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}",
        blob_url=f"file://{blobs}",
        spill_threshold_bytes=100,
        **driver,
    )

    async def run_one() -> str:
        async with create_engine(settings, registry()) as engine, engine.worker():
            run = await engine.start("spilly", {"note": BIG})
            assert (await engine.wait(run.id, timeout=30)).status == "completed"
            return run.id

    run_id = asyncio.run(run_one())
    with TestClient(create_app(create_engine(settings, registry()))) as client:
        whole = client.get(f"/runs/{run_id}/value", params={"what": "stage", "stage": "big"})
        assert whole.json() == BIG  # fetched on demand, in full
        assert client.get(f"/runs/{run_id}/value", params={"what": "input"}).json() == {"note": BIG}
        assert any(blobs.rglob("*")), "the values were not spilled"
        shutil.rmtree(blobs)  # a page that read a spilled value would now fail
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200, page.text
        html = page.text
        assert BIG not in html
        assert html.count('class="load-value"') == 3  # the input, stage big, the output
        assert f"/runs/{run_id}/value?what=output" in html
        assert f"/runs/{run_id}/value?what=stage&amp;stage=big" in html
        assert f"/runs/{run_id}/value?what=input" in html
        assert "<pre>7</pre>" in html  # an inline value is shown as it is
        assert "&#34;small&#34;: 7" in html  # and the inline part of the run's output
        gone = client.get(f"/runs/{run_id}/value", params={"what": "input"})
        assert gone.status_code == 409 and "SpilledPayloadUnavailable" not in gone.text
