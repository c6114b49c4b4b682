"""``list_runs`` reads the newest runs in one transaction (three queries, not a transaction per
run), and gives exactly what ``get_run`` gives for each of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_port import EngineSettings, RunStatus, create_engine
from engine_port.errors import InvalidInputError
from tests.ui.runs import drive_demo
from wfe_cli._demo import build_demo

BAD_PAGE_ARGUMENTS = [
    {"after": 5},
    {"created_after": "yesterday"},
    {"version": 5},
    {"idempotency_key": 5},
]


async def test_list_runs_is_get_run_for_each_newest_first(
    database_url: str, tmp_path: Path
) -> None:
    settings = EngineSettings(database_url=database_url, blob_url=f"file://{tmp_path / 'b'}")
    async with create_engine(settings, build_demo()) as engine:
        async with engine.worker():
            runs = await drive_demo(engine)
        listed = await engine.list_runs()
        assert [r.id for r in listed] == [runs.waiting, runs.failed, runs.completed]
        assert listed == [await engine.get_run(r.id) for r in listed]
        assert listed[2].output == "shipped"
        assert listed[2].stage("charge").output == {"txn": "txn-A-1", "amount": 120.0}
        assert listed[1].error is not None and listed[1].error.stage == "ship"
        failed = await engine.list_runs(workflow_id="demo-order", status=RunStatus.FAILED)
        assert [r.id for r in failed] == [runs.failed]
        assert [r.id for r in await engine.list_runs(limit=1)] == [runs.waiting]
        assert await engine.list_runs(workflow_id="other") == []


async def test_list_runs_page_walks_every_run_once_by_cursor(
    database_url: str, tmp_path: Path
) -> None:
    settings = EngineSettings(database_url=database_url, blob_url=f"file://{tmp_path / 'b'}")
    async with create_engine(settings, build_demo()) as engine:
        made = [
            (await engine.start("demo-order", {"order_id": f"P-{i}", "total": 1.0})).id
            for i in range(7)
        ]
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            page, cursor = await engine.list_runs_page(limit=3, after=cursor)
            seen += [r.id for r in page]
            pages += 1
            if cursor is None:
                break
        assert seen == list(reversed(made)) and pages == 3
        with pytest.raises(InvalidInputError, match="page cursor"):
            await engine.list_runs_page(after="not-a-cursor")
        # (each raised an AttributeError from inside the driver, or listed nothing)
        for bad in BAD_PAGE_ARGUMENTS:
            with pytest.raises(InvalidInputError):
                await engine.list_runs_page(**bad)
