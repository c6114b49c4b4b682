"""The web view used by a careless or hostile operator: odd query values, payloads JSON cannot
carry, double clicks, file uploads, wrong methods and a broken database. Each gets a page that
says what went wrong and what to do (never a bare 500), and no action is half done."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from engine_port import EngineSettings, create_engine
from tests.ui.runs import DemoRuns, make_demo_runs
from wfe_cli._demo import build_demo
from wfe_ui import create_app


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[EngineSettings, DemoRuns]:
    """Demo runs for the tests that change nothing."""
    path = tmp_path_factory.mktemp("hostile")
    settings = EngineSettings(
        database_url=f"sqlite:///{path / 'wfe.db'}", blob_url=f"file://{path / 'blobs'}"
    )
    return settings, asyncio.run(make_demo_runs(settings))


@pytest.fixture
def fresh(tmp_path: Path) -> tuple[EngineSettings, DemoRuns]:
    """Demo runs of the test's own (for tests that signal)."""
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    return settings, asyncio.run(make_demo_runs(settings))


def client(settings: EngineSettings) -> TestClient:
    app = create_app(create_engine(settings, build_demo()), allow_actions=True)
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def ui(shared: tuple[EngineSettings, DemoRuns]) -> Iterator[TestClient]:
    with client(shared[0]) as c:
        yield c


def problem_of(html: str) -> str:
    m = re.search(r'id="problem">([^<]*)<', html)
    assert m, "the page says no problem"
    return m.group(1)


def form_of(html: str) -> dict[str, str]:
    """The hidden fields of the run page's signal form (the CSRF token, the form's token)."""
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', html))


def waits_for_approval(html: str) -> bool:
    return (
        re.search(r"<strong>signal</strong> <span class=\"mono\">approval</span>", html) is not None
    )


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/runs?limit=%C2%B2", "limit must be one of"),  # "²" passes str.isdigit()
        ("/runs?refresh=%C2%B2", "refresh must be one of"),
        ("/runs?since=999999d", "since must be at most 36500d"),  # before year 1
        ("/runs/{waiting}?refresh=%C2%B2", "refresh must be one of"),
    ],
)
def test_odd_numbers_in_the_query_are_refused_with_what_is_valid(
    ui: TestClient, shared: tuple[EngineSettings, DemoRuns], path: str, says: str
) -> None:
    page = ui.get(path.format(waiting=shared[1].waiting))
    assert page.status_code == 400
    assert says in problem_of(page.text)


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ("[" * 5000 + "]" * 5000, "nested far deeper than the engine stores"),  # was a 500
        ("[" * 300 + "]" * 300, "nested more than 64 levels deep"),  # was a 409 for stage code
        ("9" * 5000, "send it as a string"),  # over Python's digit limit: was a 500
        ('{"total": NaN}', "signal payload.total contains nan, which JSON cannot carry"),
        ("-Infinity", "signal payload contains -inf, which JSON cannot carry"),
        ('{"note": "</textarea><script>alert(1)</script>", oops}', "the payload is not JSON"),
    ],
)
def test_a_payload_json_cannot_carry_is_refused_and_kept_in_the_form(
    fresh: tuple[EngineSettings, DemoRuns], payload: str, says: str
) -> None:
    settings, runs = fresh
    with client(settings) as c:
        hidden = form_of(c.get(f"/runs/{runs.waiting}").text)
        answer = c.post(
            f"/runs/{runs.waiting}/signal",
            data={**hidden, "name": "approval", "payload": payload},
        )
        assert answer.status_code == 400
        assert says in problem_of(answer.text)
        # the form comes back as it was typed (escaped), to be corrected rather than retyped
        kept = re.search(r'<textarea name="payload"[^>]*>([^<]*)</textarea>', answer.text)
        assert kept is not None and html.unescape(kept.group(1)) == payload
        assert "<script>alert(1)" not in answer.text
        # nothing was sent: the run still waits for its approval
        assert waits_for_approval(c.get(f"/runs/{runs.waiting}").text)


def test_a_double_click_on_the_signal_form_sends_one_signal(
    fresh: tuple[EngineSettings, DemoRuns],
) -> None:
    settings, runs = fresh
    with client(settings) as c:
        hidden = form_of(c.get(f"/runs/{runs.waiting}").text)
        data = {**hidden, "name": "approval", "payload": '{"approved_by": "ops"}'}
        first = c.post(f"/runs/{runs.waiting}/signal", data=data)
        second = c.post(f"/runs/{runs.waiting}/signal", data=data)  # the same rendered form
        assert "Signal delivered" in first.text
        assert "the signal was not sent again" in second.text
        # a new page load gives a new form: an intended second signal is sent
        again = {**form_of(second.text), "name": "approval", "payload": "{}"}
        third = c.post(f"/runs/{runs.waiting}/signal", data=again)
        assert "Signal queued" in third.text

    async def queued() -> list[Any]:
        async with create_engine(settings, build_demo()) as engine:
            return [s.payload for s in (await engine.export_run(runs.waiting)).signals]

    # the run's signals (no worker ran the stage yet): the double click left one copy
    assert asyncio.run(queued()) == [{"approved_by": "ops"}, {}]


def test_a_file_upload_is_not_sent_as_an_empty_payload(
    fresh: tuple[EngineSettings, DemoRuns],
) -> None:
    settings, runs = fresh
    with client(settings) as c:
        hidden = form_of(c.get(f"/runs/{runs.waiting}").text)
        answer = c.post(
            f"/runs/{runs.waiting}/signal",
            data={**hidden, "name": "approval"},
            files={"payload": ("approval.json", b'{"approved_by": "ops"}', "application/json")},
        )
        assert answer.status_code == 400
        assert "payload must be a text field, not a file upload" in answer.text
        assert waits_for_approval(c.get(f"/runs/{runs.waiting}").text)


def test_a_form_over_the_size_limit_says_the_limit(
    ui: TestClient, shared: tuple[EngineSettings, DemoRuns]
) -> None:
    hidden = form_of(ui.get(f"/runs/{shared[1].waiting}").text)
    answer = ui.post(
        f"/runs/{shared[1].waiting}/signal",
        data={**hidden, "name": "approval", "payload": '"' + "x" * (2 << 20) + '"'},
    )
    assert answer.status_code == 400
    assert "can be at most 1 MiB" in problem_of(answer.text)


def test_wrong_methods_and_addresses_say_what_the_address_takes(
    ui: TestClient, shared: tuple[EngineSettings, DemoRuns]
) -> None:
    for method in ("GET", "PUT", "DELETE"):
        answer = ui.request(method, f"/runs/{shared[1].waiting}/cancel")
        assert answer.status_code == 405
        assert answer.headers["allow"] == "POST"
        assert "takes POST" in problem_of(answer.text)
    posted = ui.post("/runs")
    assert posted.status_code == 405 and "GET" in posted.headers["allow"]
    missing = ui.get("/runs/a%2Fb/graph")
    assert missing.status_code == 404 and "the runs are at /runs" in problem_of(missing.text)


def test_a_corrupt_database_is_an_error_page_without_a_traceback(tmp_path: Path) -> None:
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'b'}"
    )
    asyncio.run(create_engine(settings, None).connect())  # the schema
    with client(settings) as c:
        token = form_of(c.get("/outbox").text)["csrf"]
        for f in tmp_path.glob("wfe.db*"):  # an operator's script overwrote the file
            f.write_bytes(b"not a database" * 4096)
        for answer in (
            c.get("/runs"),
            c.get("/versions"),
            c.post("/outbox/flush", data={"csrf": token}),
        ):
            # (the driver's DriverUnavailableError since 1bbcb5f: the storage is failing)
            assert answer.status_code == 503
            assert answer.headers["content-type"].startswith("text/html")
            # SQLite says "file is not a database" or, when a connection had read pages of
            # the old file before it was overwritten, "database disk image is malformed"
            problem = problem_of(answer.text)
            assert "file is not a database" in problem or "disk image is malformed" in problem
            assert "names a wfe SQLite file" in problem
            assert "Traceback" not in answer.text
            assert answer.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    ("fault", "code", "says"),
    [
        (ConnectionResetError(104, "Connection reset by peer"), 503, "unreachable or failing"),
        (KeyError("stage"), 500, "not of your request"),
    ],
)
def test_an_error_a_driver_lets_through_is_a_page_without_a_traceback(
    shared: tuple[EngineSettings, DemoRuns],
    monkeypatch: pytest.MonkeyPatch,
    fault: Exception,
    code: int,
    says: str,
) -> None:
    """A network error a driver lets through (not translated to DriverUnavailableError) says
    to retry (503); any other is the server's fault (500); neither shows a traceback."""
    engine = create_engine(shared[0], build_demo())

    async def failing(*args: object, **kwargs: object) -> object:
        raise fault

    monkeypatch.setattr(engine, "list_versions", failing)
    with TestClient(create_app(engine), raise_server_exceptions=False) as c:
        answer = c.get("/versions")
    assert answer.status_code == code
    assert says in problem_of(answer.text)
    assert type(fault).__name__ in answer.text and "Traceback" not in answer.text


@pytest.mark.parametrize(
    "path", ["/runs/{waiting}%0A", "/runs/{waiting}/value?what=stage&stage=approve%0A"]
)
def test_a_trailing_newline_is_a_control_character_too(
    ui: TestClient, shared: tuple[EngineSettings, DemoRuns], path: str
) -> None:
    """The check's pattern ended in "$", which also matches before a trailing newline: a run
    id or a stage name ending in one was taken as printable and looked up."""
    page = ui.get(path.format(waiting=shared[1].waiting))
    assert page.status_code == 400
    assert "no control characters" in page.text
