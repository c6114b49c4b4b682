"""The same pages and actions on native-PostgreSQL and on the Temporal driver (the browser
test covers native-SQLite): the web view only uses the port, so a run reads the same."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from engine_port import EngineSettings, create_engine
from tests.support.databases import PostgresSession
from tests.ui.runs import DemoRuns, drive_demo, wait_status
from wfe_cli._demo import build_demo
from wfe_ui import create_app


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("temporal", marks=pytest.mark.temporal),
    ]
)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> EngineSettings:
    if request.param == "postgres":
        session: PostgresSession = request.getfixturevalue("pg_session")
        return EngineSettings(database_url=session.new_schema())
    server: Any = request.getfixturevalue("temporal_server")
    return EngineSettings(
        driver="temporal",
        temporal_address=server.address,
        task_queue=f"ui-{uuid.uuid4().hex[:10]}",
        blob_url=f"file://{tmp_path / 'blobs'}",
        temporal_ui_url="http://127.0.0.1:8233",
    )


def check_pages(settings: EngineSettings, runs: DemoRuns) -> None:
    """Every page, then signal and cancel, through a view with its own engine (as `wfe ui`
    in another process would be), while the test's worker runs the runs."""
    app = create_app(create_engine(settings, build_demo()), allow_actions=True)
    with TestClient(app) as client:
        listing = client.get("/runs").text
        for run_id in (runs.completed, runs.failed, runs.waiting):
            assert run_id in listing
        assert runs.waiting in client.get("/runs", params={"q": "order-C-3"}).text
        failed = client.get(f"/runs/{runs.failed}").text
        assert 'data-stage="ship" data-status="failed"' in failed
        assert 'data-stage="reserve" data-status="compensated"' in failed
        assert "the carrier rejected the parcel" in failed
        waiting = client.get(f"/runs/{runs.waiting}").text
        # the event stream on every driver (Temporal: rebuilt from the run's histories)
        assert 'id="events"' in waiting
        assert re.search(r"<td>stage\.suspended</td><td>approve</td>", waiting)
        failed_events = re.findall(r"<tr><td>(\d+)</td><td>([a-z.]+)", failed)
        assert [int(seq) for seq, _ in failed_events] == list(range(1, len(failed_events) + 1))
        assert tuple(t for _, t in failed_events if t in ("stage.failed", "run.failed"))[-2:] == (
            "stage.failed",
            "run.failed",
        )
        assert '<td class="t-fail">fail</td>' in failed  # the timeline of attempts
        if settings.driver == "temporal":  # and a link to the run's history in the Web UI
            assert (
                'href="http://127.0.0.1:8233/namespaces/default/workflows?query=WorkflowId'
                f'%3D%22{runs.waiting}%22" id="temporal-history"'
            ) in waiting
        # every filter is applied by the driver: version, age, status, workflow, search
        version = re.search(r'<dt>version</dt><dd class="mono">([^<]+)<', waiting)
        assert version
        narrowed = client.get(
            "/runs",
            params={
                "version": version.group(1),
                "since": "1h",
                "status": "failed",
                "workflow": "demo-order",
            },
        ).text
        assert runs.failed in narrowed and runs.completed not in narrowed
        assert "look at the newest" not in narrowed
        assert runs.completed in client.get("/runs", params={"q": runs.completed[:8]}).text
        assert re.search(r"<strong>signal</strong> <span class=\"mono\">approval</span>", waiting)
        assert "demo-order" in client.get("/versions").text
        outbox = client.get("/outbox")
        assert outbox.status_code == 200
        if settings.driver == "temporal":  # no outbox table: the page says so, and what it has
            assert 'id="native-only"' in outbox.text and "dlq/" in outbox.text
        else:
            assert 'id="dead">0<' in outbox.text
        token = re.search(r'name="csrf" value="([^"]+)"', waiting)
        assert token
        sent = client.post(
            f"/runs/{runs.waiting}/signal",
            data={"name": "approval", "payload": "{}", "csrf": token.group(1)},
        )
        assert "Signal delivered to the step waiting for it." in sent.text


async def test_bad_page_arguments_are_typed_errors(settings: EngineSettings) -> None:
    """``list_runs_page`` (what the view pages with) refuses a cursor, date, version or key
    of the wrong type with InvalidInputError on every driver."""
    from engine_port.errors import InvalidInputError
    from tests.integration.native.test_list_runs import BAD_PAGE_ARGUMENTS

    async with create_engine(settings, build_demo()) as engine:
        for bad in BAD_PAGE_ARGUMENTS:
            with pytest.raises(InvalidInputError):
                await engine.list_runs_page(**bad)  # type: ignore[attr-defined]


async def test_the_view_on_postgres_and_temporal(settings: EngineSettings) -> None:
    async with create_engine(settings, build_demo()) as engine, engine.worker():
        runs = await drive_demo(engine)
        await asyncio.to_thread(check_pages, settings, runs)
        # pages by the driver's cursor (Temporal: its next_page_token), each run once
        seen: list[str] = []
        cursor = None
        for _ in range(5):
            page, cursor = await engine.list_runs_page(  # type: ignore[attr-defined]
                limit=2, after=cursor, outputs=False
            )
            seen += [r.id for r in page]
            if cursor is None:
                break
        assert sorted(seen) == sorted([runs.completed, runs.failed, runs.waiting])
        done = await engine.wait(runs.waiting, timeout=30)
        assert done.status == "completed"
        extra = await engine.start("demo-order", {"order_id": "D-4", "total": 1.0})
        await wait_status(engine, extra.id, "suspended")

        def cancel() -> str:
            app = create_app(create_engine(settings, build_demo()), allow_actions=True)
            with TestClient(app) as client:
                page = client.get(f"/runs/{extra.id}").text
                token = re.search(r'name="csrf" value="([^"]+)"', page)
                assert token
                return client.post(f"/runs/{extra.id}/cancel", data={"csrf": token.group(1)}).text

        assert "Run cancelled" in await asyncio.to_thread(cancel)
        assert (await engine.wait(extra.id, timeout=30)).status == "cancelled"
