"""The web view in a real browser: Debian's chromium driven by playwright loads every page for
runs of the demo workflow (native-SQLite), clicks signal and cancel, and checks what it shows.

Screenshots go to tmp_path, or to ``WFE_UI_SCREENSHOT_DIR`` (how docs/ui-*.png were made)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.async_api import Page, async_playwright, expect

from engine_port import EngineSettings, RunStatus, create_engine
from tests.ui.runs import DemoRuns, make_demo_runs, wait_status
from wfe_cli._demo import build_demo
from wfe_ui import create_app

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Served:
    url: str
    settings: EngineSettings
    runs: DemoRuns
    shots: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """The demo runs, and ``wfe ui --allow-actions`` over them on a free loopback port."""
    if not os.path.exists(CHROMIUM):
        msg = f"{CHROMIUM} is missing: apt-get install -y chromium (./dev test does it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    settings = EngineSettings(
        database_url=f"sqlite:///{tmp_path / 'wfe.db'}", blob_url=f"file://{tmp_path / 'blobs'}"
    )
    runs = asyncio.run(make_demo_runs(settings))
    registry = build_demo()
    app = create_app(create_engine(settings, registry), allow_actions=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "wfe ui did not start"
        time.sleep(0.02)
    shots = Path(os.environ.get("WFE_UI_SCREENSHOT_DIR") or tmp_path)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", settings, runs, shots)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
async def page() -> AsyncIterator[Page]:
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            yield await context.new_page()
        finally:
            await browser.close()


async def reload_until(page: Page, selector: str, text: str, timeout: float = 20) -> None:
    """Reload the page (as the auto-refresh does) until ``selector`` reads ``text``."""
    deadline = time.monotonic() + timeout
    while (await page.locator(selector).inner_text()).strip() != text:
        assert time.monotonic() < deadline, f"{selector} never read {text!r}"
        await asyncio.sleep(0.1)
        await page.reload()


def box(page: Page, stage: str) -> Any:
    return page.locator(f'svg#graph g[data-stage="{stage}"]')


async def test_pages_signal_and_cancel_in_a_browser(served: Served, page: Page) -> None:
    runs = served.runs
    async with create_engine(served.settings, build_demo()) as engine, engine.worker():
        # runs list: every run, its status, a link to its page
        await page.goto(served.url + "/")
        await expect(page.locator("h1")).to_have_text("Runs")
        rows = page.locator("table#runs tbody tr")
        await expect(rows).to_have_count(3)
        await expect(page.locator("table#runs")).to_contain_text("suspended")
        await page.screenshot(path=str(served.shots / "ui-runs.png"))

        # the failed run: the graph by execution group, the error, the compensations
        await page.click(f"text={runs.failed}")
        await expect(page.locator("#run-status")).to_have_text("failed")
        await expect(box(page, "ship")).to_have_attribute("data-status", "failed")
        await expect(box(page, "reserve")).to_have_attribute("data-status", "compensated")
        await expect(page.locator("#run-error")).to_contain_text("the carrier rejected the parcel")
        await expect(page.locator("#events")).to_contain_text("stage.compensated")
        ship = await box(page, "ship").bounding_box()
        reserve = await box(page, "reserve").bounding_box()
        assert ship and reserve and ship["x"] > reserve["x"]  # groups are columns
        await page.screenshot(path=str(served.shots / "ui-run-failed.png"), full_page=True)

        # the waiting run: says it waits for the approval signal; send it from the page
        await page.goto(f"{served.url}/runs/{runs.waiting}")
        await expect(page.locator("#waiting")).to_contain_text("approval")
        await expect(box(page, "approve")).to_have_attribute("data-status", "suspended")
        await page.screenshot(path=str(served.shots / "ui-run.png"), full_page=True)
        await expect(page.locator("#signal-name")).to_have_value("approval")
        await page.fill("#signal-payload", '{"approved_by": "browser"}')
        await page.click("#send-signal")
        await expect(page.locator("#message")).to_have_text(
            "Signal delivered to the step waiting for it."
        )
        await reload_until(page, "#run-status", "completed")
        await expect(box(page, "ship")).to_have_attribute("data-status", "completed")
        await expect(page.locator("#output")).to_contain_text("shipped")
        await expect(page.locator("#actions")).to_contain_text("Redrive")

        # a new run waiting for approval: cancel it from the page
        extra = await engine.start("demo-order", {"order_id": "D-4", "total": 1.0})
        await wait_status(engine, extra.id, RunStatus.SUSPENDED)
        await page.goto(f"{served.url}/runs/{extra.id}")
        await page.click("#cancel")
        await expect(page.locator("#message")).to_contain_text("Run cancelled")
        await reload_until(page, "#run-status", "cancelled")
        await expect(box(page, "reserve")).to_have_attribute("data-status", "compensated")

        # versions and outbox
        await page.click("text=Versions")
        await expect(page.locator("table#versions")).to_contain_text("demo-order")
        await page.click("text=Outbox")
        await expect(page.locator("#dead")).to_have_text("0")
        await page.click("#replay")
        await expect(page.locator("#result")).to_contain_text("queued for delivery again")
