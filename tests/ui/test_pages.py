"""The web view's pages and actions through Starlette's TestClient, on real engines."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from engine_port import EngineSettings, create_engine
from engine_port.errors import EngineError
from tests.ui.runs import DemoRuns, make_demo_runs
from wfe_cli._demo import build_demo
from wfe_ui import create_app


@pytest.fixture(scope="module")
def sqlite_settings(tmp_path_factory: pytest.TempPathFactory) -> EngineSettings:
    path = tmp_path_factory.mktemp("ui")
    return EngineSettings(
        database_url=f"sqlite:///{path / 'wfe.db'}", blob_url=f"file://{path / 'blobs'}"
    )


@pytest.fixture(scope="module")
def runs(sqlite_settings: EngineSettings) -> DemoRuns:
    return asyncio.run(make_demo_runs(sqlite_settings))


def client_for(settings: EngineSettings, *, allow_actions: bool, **options: float) -> TestClient:
    engine = create_engine(settings, build_demo(), **options)
    return TestClient(create_app(engine, allow_actions=allow_actions))


@pytest.fixture
def ro(sqlite_settings: EngineSettings, runs: DemoRuns) -> Iterator[TestClient]:
    with client_for(sqlite_settings, allow_actions=False) as client:
        yield client


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def test_runs_list_shows_every_run_and_filters(ro: TestClient, runs: DemoRuns) -> None:
    page = ro.get("/runs")
    assert page.status_code == 200
    for run_id in (runs.completed, runs.failed, runs.waiting):
        assert run_id in page.text
    assert '<meta http-equiv="refresh" content="10">' in page.text
    failed = ro.get("/runs", params={"status": "failed"}).text
    assert runs.failed in failed and runs.completed not in failed
    by_key = ro.get("/runs", params={"q": "order-C-3"}).text
    assert runs.waiting in by_key and runs.failed not in by_key
    by_prefix = ro.get("/runs", params={"q": runs.completed[:8]}).text
    assert runs.completed in by_prefix
    none = ro.get("/runs", params={"workflow": "no-such-workflow"}).text
    assert "No runs match." in none
    old = ro.get("/runs", params={"since": "1s", "version": "nope"}).text
    assert "No runs match." in old


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"status": "done"}, "status must be one of"),
        ({"limit": "100000"}, "limit must be one of"),
        ({"since": "yesterday"}, "since must be a number and a unit"),
        ({"workflow": "x" * 201}, "workflow must be 1 to 200"),
        ({"q": "a\x00b"}, "q must be 1 to 300 printable"),
        ({"refresh": "1"}, "refresh must be one of"),
    ],
)
def test_bad_filters_are_refused_with_what_is_valid(
    ro: TestClient, params: dict[str, str], says: str
) -> None:
    page = ro.get("/runs", params=params)
    assert page.status_code == 400
    assert says in page.text


def test_run_page_draws_the_groups_and_shows_the_failure(ro: TestClient, runs: DemoRuns) -> None:
    page = ro.get(f"/runs/{runs.failed}")
    assert page.status_code == 200
    html = page.text
    # five execution groups as columns: reserve | fraud_check, price | approve | charge | ship
    xs = {
        stage: int(x)
        for stage, x in re.findall(
            r'data-stage="(\w+)" data-status="\w+">\s*<title>[^<]*</title>'
            r'\s*<rect x="(\d+)"',
            html,
        )
    }
    assert xs["fraud_check"] == xs["price"] > xs["reserve"]
    assert xs["reserve"] < xs["approve"] < xs["charge"] < xs["ship"]
    assert 'data-stage="ship" data-status="failed"' in html
    assert 'data-stage="reserve" data-status="compensated"' in html
    assert "the carrier rejected the parcel" in html
    assert "NonRetryableError" in html
    assert "run.failed" in html and "stage.compensated" in html  # the event stream
    assert "Execution groups unknown" not in html
    assert "Send signal" not in html and "Redrive" not in html  # read-only


def test_run_page_says_what_the_run_waits_for(ro: TestClient, runs: DemoRuns) -> None:
    html = ro.get(f"/runs/{runs.waiting}").text
    assert re.search(r"<strong>signal</strong> <span class=\"mono\">approval</span>", html)
    assert 'data-stage="approve" data-status="suspended"' in html


def test_full_values_are_served_as_json(ro: TestClient, runs: DemoRuns) -> None:
    assert ro.get(f"/runs/{runs.completed}/value", params={"what": "input"}).json() == {
        "order_id": "A-1",
        "total": 100.0,
        "fail_shipping": False,
    }
    out = ro.get(f"/runs/{runs.completed}/value", params={"what": "stage", "stage": "charge"})
    assert out.json() == {"txn": "txn-A-1", "amount": 120.0}
    assert ro.get(f"/runs/{runs.completed}/value", params={"what": "x"}).status_code == 400


def test_unknown_and_invalid_run_ids(ro: TestClient) -> None:
    missing = ro.get("/runs/no-such-run")
    assert missing.status_code == 404 and "no-such-run" in missing.text
    assert ro.get("/runs/" + "x" * 65).status_code == 400


def test_versions_and_outbox_pages(ro: TestClient) -> None:
    versions = ro.get("/versions")
    assert versions.status_code == 200 and "demo-order" in versions.text
    outbox = ro.get("/outbox")
    assert outbox.status_code == 200 and 'id="dead">0<' in outbox.text
    assert "Replay dead letters" not in outbox.text


def test_versions_page_says_where_new_runs_of_a_drained_workflow_go(
    ro: TestClient, sqlite_settings: EngineSettings
) -> None:
    async def drain(target: str | None) -> None:
        async with create_engine(sqlite_settings, build_demo()) as engine:
            await engine.drain(["demo-order"], target)

    assert '<td class="new-runs">here</td>' in ro.get("/versions").text
    asyncio.run(drain("temporal"))
    try:
        assert '<td class="new-runs">to temporal</td>' in ro.get("/versions").text
    finally:
        asyncio.run(drain(None))


def test_read_only_refuses_every_post(ro: TestClient, runs: DemoRuns) -> None:
    for path in (f"/runs/{runs.waiting}/signal", f"/runs/{runs.waiting}/cancel", "/outbox/replay"):
        answer = ro.post(path, data={"name": "approval"})
        assert answer.status_code == 403
        assert "--allow-actions" in answer.text


def test_security_headers(ro: TestClient) -> None:
    headers = ro.get("/runs").headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"


def test_actions_need_the_token_and_the_same_origin(
    sqlite_settings: EngineSettings, runs: DemoRuns
) -> None:
    with client_for(sqlite_settings, allow_actions=True) as client:
        url = f"/runs/{runs.waiting}/signal"
        assert client.post(url, data={"name": "approval"}).status_code == 403
        token = csrf_of(client.get(f"/runs/{runs.waiting}").text)
        cross = client.post(
            url,
            data={"name": "approval", "csrf": token},
            headers={"origin": "http://evil.example"},
        )
        assert cross.status_code == 403
        bad_json = client.post(url, data={"name": "approval", "payload": "{", "csrf": token})
        assert bad_json.status_code == 400 and "the payload is not JSON" in bad_json.text


def test_signal_cancel_redrive_and_replay(tmp_path: Path) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    runs = asyncio.run(make_demo_runs(settings))
    # (no worker: the Cancel button's cancel() would wait its default 10 s for one to end
    # the run; it shows the run compensating after a short wait as after a long one)
    with client_for(settings, allow_actions=True, cancel_wait=0.2) as client:
        page = client.get(f"/runs/{runs.waiting}").text
        assert 'value="approval"' in page  # the signal name the run waits for
        token = csrf_of(page)
        sent = client.post(
            f"/runs/{runs.waiting}/signal",
            data={"name": "approval", "payload": '{"ok": true}', "csrf": token},
            headers={"origin": "http://testserver"},
        )
        assert sent.status_code == 200  # followed the 303 back to the run page
        assert "Signal delivered to the step waiting for it." in sent.text
        again = client.post(
            f"/runs/{runs.waiting}/signal",
            data={"name": "approval", "csrf": token, "idempotency_key": "k1"},
        )
        assert "Signal queued" in again.text
        cancelled = client.post(f"/runs/{runs.waiting}/cancel", data={"csrf": token})
        assert "Run cancelled" in cancelled.text
        assert re.search(r'id="run-status">(cancelled|compensating)<', cancelled.text)
        refused = client.post(f"/runs/{runs.completed}/cancel", data={"csrf": token})
        assert refused.status_code == 409 and 'id="problem"' in refused.text
        redriven = client.post(f"/runs/{runs.failed}/redrive", data={"from": "ship", "csrf": token})
        assert "Run redriven" in redriven.text
        unknown = client.post(
            f"/runs/{runs.completed}/redrive", data={"from": "no-such-stage", "csrf": token}
        )
        assert unknown.status_code in (400, 409) and 'id="problem"' in unknown.text
        assert "no-such-stage" in unknown.text
        replay = client.post("/outbox/replay", data={"csrf": token})
        assert "dead-lettered event(s) queued" in replay.text


def test_runs_list_pages_by_cursor(tmp_path: Path) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )

    async def start_many() -> list[str]:
        async with create_engine(settings, build_demo()) as engine:
            return [
                (await engine.start("demo-order", {"order_id": f"P-{i}", "total": 1.0})).id
                for i in range(25)
            ]

    made = asyncio.run(start_many())
    with client_for(settings, allow_actions=False) as client:
        first = client.get("/runs", params={"limit": "20"}).text
        older = re.search(r'href="(/runs\?[^"]+)" id="older"', first)
        assert older, "no link to the older runs"
        second = client.get(older.group(1).replace("&amp;", "&")).text
        assert 'id="older"' not in second and 'id="newest"' in second
        ids = [re.findall(r'class="run-link">([0-9a-f]+)<', page) for page in (first, second)]
        assert len(ids[0]) == 20 and len(ids[1]) == 5
        assert ids[0] + ids[1] == list(reversed(made))  # newest first, each run once
        bad = client.get("/runs", params={"after": "yesterday"})
        assert bad.status_code == 400 and "page cursor" in bad.text


def test_hostile_values_are_escaped_and_groups_unknown_without_the_app(tmp_path: Path) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'

    async def start() -> str:
        async with create_engine(settings, build_demo()) as engine:
            run = await engine.start(
                "demo-order", {"order_id": hostile, "total": 1.0}, idempotency_key=hostile
            )
            return run.id

    run_id = asyncio.run(start())
    # no registry: the view still shows the run, one stage per column, and says why
    with TestClient(create_app(create_engine(settings, None))) as client:
        listing = client.get("/runs").text
        page = client.get(f"/runs/{run_id}").text
    for html in (listing, page):
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Execution groups unknown" in page
    xs = re.findall(r'<rect x="(\d+)"', page)
    assert len(xs) == 6 and len(set(xs)) == 6


def test_an_event_stream_that_cannot_be_read_is_said_on_the_page(
    sqlite_settings: EngineSettings, runs: DemoRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver whose ``events`` fails for this run (the Temporal driver when a history does
    not replay on its code) still shows the run, and says why the events are missing."""
    engine = create_engine(sqlite_settings, build_demo())

    async def failing(run_id: str) -> list[object]:
        raise EngineError(f"the history of run {run_id!r} does not replay on this driver's code")

    monkeypatch.setattr(engine, "events", failing)
    with TestClient(create_app(engine)) as client:
        page = client.get(f"/runs/{runs.failed}")
    assert page.status_code == 200
    assert 'id="events-problem"' in page.text
    assert "does not replay on this driver&#39;s code" in page.text
    assert 'id="events"' not in page.text
    assert 'data-stage="ship" data-status="failed"' in page.text  # the rest of the page
