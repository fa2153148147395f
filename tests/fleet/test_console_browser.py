"""The web console in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

A fleet of real processes; the browser signs in with the token, sees the
worker, sees a commit appear live (no reload), retries a quarantined dataset
from the page and sees it commit. A screenshot is kept in ``test-artifacts/``.
No browser is downloaded: scripts/bootstrap.sh installs chromium with apt.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import ConsoleMessage, Error, async_playwright

from shared.commit import read_manifest
from shared.events import DatasetExpectation, JobFinished, JobStarted, QueueEvent
from tests._support.fleet_checks import committed
from tests._support.fleet_jobs import corrupted_job, good_job, stage_task
from tests._support.ports import free_port
from tests._support.process_fleet import Fleet
from tests._support.wait import wait_for

pytestmark = pytest.mark.browser

TOKEN = "console-test-token-0123456789"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
MS = 30_000  # a locator's wait, in milliseconds


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    return {"coordinator": {"http_port": free_port(), "admin_token": TOKEN}}


async def test_console_shows_the_fleet_live_and_retries_a_quarantine(fleet: Fleet) -> None:
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all shards")
    base = f"http://127.0.0.1:{fleet.settings.coordinator.http_port}"
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":  # a CSP violation, a failed asset, a script error
            problems.append(f"console: {msg.text}")

    async with async_playwright() as pw:
        # --no-sandbox: the tests may run as root (CI containers), where Chromium's sandbox cannot start.
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))

            # Not signed in: the login form; the token is entered once.
            await page.goto(f"{base}/ui")
            assert page.url == f"{base}/ui/login"
            await page.fill("#token", TOKEN)
            await page.click("#login button[type=submit]")
            await page.wait_for_url(f"{base}/ui")
            cookies = await page.context.cookies()
            session = [c for c in cookies if c["name"] == "commitfleet_session"]
            assert session and session[0]["httpOnly"] and session[0]["sameSite"] == "Strict"

            # The running fleet's worker and its shards.
            row = page.locator('#workers tr[data-worker="w1"]')
            await row.wait_for(timeout=MS)
            assert "8: 0-7" in await row.inner_text()
            await page.locator("#live.on").wait_for(timeout=MS)

            # A commit appears without a reload.
            await fleet.publisher.publish_many(await good_job(fleet.store, "j-live", ["live"], tasks=2))
            await page.locator('#events li.committed[data-dataset="live"]').wait_for(timeout=MS)
            assert await committed(fleet.store, ["live"], "j-live")
            rate = page.locator("#rate-now")
            await page.wait_for_function(
                "() => /^[1-9]\\d* in the hour/.test(document.querySelector('#rate-now').textContent)",
                timeout=MS,
            )
            assert "in the hour" in await rate.inner_text()
            # The latency chart marks the minute's mean and max.
            await page.locator("#chart-latency g.mean rect").first.wait_for(timeout=MS)
            assert await page.locator("#chart-latency g.max rect").count() >= 1
            assert "last mean" in await page.locator("#lat-now").inner_text()

            # A dataset waiting for a task shows in the pending table (a page of /status/datasets).
            waiting: list[QueueEvent] = [
                JobStarted(job="j-wait", datasets=["wt"], timeout_s=600, started_at=time.time()),
                await stage_task(fleet.store, "j-wait", "wt", 0, 0),
                JobFinished(
                    job="j-wait", datasets={"wt": DatasetExpectation(tasks=2)}, finished_at=time.time()
                ),
            ]
            await fleet.publisher.publish_many(waiting)
            pending = page.locator('#pending tr[data-dataset="wt"]')
            await pending.wait_for(timeout=MS)
            assert "j-wait" in await pending.inner_text() and "waiting" in await pending.inner_text()
            await page.locator("#pending-count", has_text="(1)").wait_for(timeout=MS)
            assert await page.locator("#pending-more").is_hidden()

            # A quarantined dataset, its reason, and a retry from the page once the cause is fixed.
            evs, key, right = await corrupted_job(fleet.store, "j-fix", "qa")
            await fleet.publisher.publish_many(evs)
            quarantined = page.locator('#quarantined tr[data-dataset="qa"][data-job="j-fix"]')
            await quarantined.wait_for(timeout=MS)
            assert "publish" in await quarantined.locator("td.reason").inner_text()
            await fleet.store.write(key, right)
            await quarantined.locator("button.retry").click()
            await page.locator("#action-result", has_text="queued").wait_for(timeout=MS)
            await page.locator('#events li.operator_action[data-dataset="qa"]').wait_for(timeout=MS)
            await page.locator('#events li.committed[data-dataset="qa"]').wait_for(timeout=MS)
            await quarantined.wait_for(state="detached", timeout=MS)
            assert await read_manifest(fleet.store, "qa", "j-fix") is not None

            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "console.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        except Error as exc:
            raise AssertionError(f"browser: {exc}\n{problems}") from None
        finally:
            await browser.close()
    assert problems == [], problems
