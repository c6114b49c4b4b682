"""The web view marks a run frozen for a move (its page and the runs list) and says how to
finish or give back the move: a run an interrupted migration left frozen refuses its signals,
and nothing else showed why."""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.testclient import TestClient

from engine_port import EngineSettings, abort_migration, create_engine
from tests.ui.runs import make_demo_runs
from wfe_cli._demo import build_demo
from wfe_ui import create_app


def test_a_frozen_run_is_marked_on_its_page_and_in_the_list(tmp_path: Path) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    runs = asyncio.run(make_demo_runs(settings))

    async def freeze() -> None:
        async with create_engine(settings, build_demo()) as engine:
            await engine.export_run(runs.waiting)

    async def give_back() -> None:
        source = create_engine(settings, build_demo())
        target = create_engine(settings.model_copy(update={"driver": "memory"}), build_demo())
        async with source, target:
            await abort_migration(source, target, [runs.waiting])

    with TestClient(create_app(create_engine(settings, build_demo()))) as ui:
        before = ui.get(f"/runs/{runs.waiting}").text
        assert 'id="run-frozen"' not in before and "Frozen:" not in before
        asyncio.run(freeze())
        page = ui.get(f"/runs/{runs.waiting}").text
        assert 'id="run-frozen">frozen</span>' in page
        assert f"wfe migrate --from SOURCE --to TARGET --run {runs.waiting}" in page
        listing = ui.get("/runs").text
        assert listing.count('class="status s-frozen"') == 1
        asyncio.run(give_back())
        after = ui.get(f"/runs/{runs.waiting}").text
        assert 'id="run-frozen"' not in after and "Frozen:" not in after
        assert 'class="status s-frozen"' not in ui.get("/runs").text
