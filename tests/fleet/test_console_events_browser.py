"""The console's events panel in a real headless Chromium: history on load, filters, live events once.

A coordinator process over a Redis whose admin stream already holds 260
events: the panel shows the newest 200 at once (no new event needed), the
rest behind "older events"; the type, job and dataset filters apply to the
history and to the live events; a live event that matches is appended once,
one that does not never shows.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import aiohttp
import pytest
from playwright.async_api import ConsoleMessage, Error, Page, async_playwright

from shared.events import AdminEvent, Committed, Quarantined
from shared.queue import AdminPublisher
from tests._support.ports import free_port
from tests._support.process_fleet import Fleet
from tests._support.wait import wait_for

pytestmark = pytest.mark.browser

TOKEN = "console-events-token-0123456789"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MS = 30_000  # a locator's wait, in milliseconds
PAGE = 200  # PAGE_EVENTS in app.js


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    return {"coordinator": {"http_port": free_port(), "admin_token": TOKEN}}


def _event(i: int) -> AdminEvent:
    """The i-th event of the history: every 4th a quarantine, datasets d0..d4, jobs j0..j2."""
    if i % 4 == 3:
        return Quarantined(at=time.time(), dataset=f"d{i % 5}", job=f"j{i % 3}", reason=f"r{i}")
    return Committed(at=time.time(), dataset=f"d{i % 5}", job=f"j{i % 3}", files=1, bytes=i, duration_s=0.1)


async def _shown(page: Page) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = await page.eval_on_selector_all(
        "#events li", "els => els.map(e => ({...e.dataset}))"
    )
    return rows


async def test_events_panel_history_filters_and_live(fleet: Fleet) -> None:
    admin = AdminPublisher(fleet.redis, fleet.keys)
    history: list[tuple[str, AdminEvent]] = []
    for i in range(260):
        ev = _event(i)
        history.append(((await admin.publish(ev)).decode(), ev))
    newest_first = [i for i, _ in reversed(history)]
    fleet.start("coordinator", "c1")
    base = f"http://127.0.0.1:{fleet.settings.coordinator.http_port}"

    async def serving() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(f"{base}/healthz") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    await wait_for(serving, timeout=60, what="the coordinator's admin API")

    async def stream_ids(newest: str, count: int) -> list[str]:
        rows = await fleet.redis.xrevrange(fleet.keys.admin, max=newest, count=count)
        return [r[0].decode() for r in rows]

    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            problems.append(f"console: {msg.text}")

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            await page.goto(f"{base}/ui")
            await page.fill("#token", TOKEN)
            await page.click("#login button[type=submit]")
            await page.wait_for_url(f"{base}/ui")

            # On load, before any new event: the newest page of the history, newest first.
            # (The coordinator adds events of its own: the stream, not our list, is the reference.)
            await page.locator("#events li").nth(PAGE - 1).wait_for(timeout=MS)
            shown = [r["id"] for r in await _shown(page)]
            assert shown == await stream_ids(shown[0], PAGE)
            assert set(newest_first[: PAGE - 20]) <= set(shown)
            await page.locator("#live.on").wait_for(timeout=MS)
            older = page.locator("#events-older")
            assert await older.is_visible()
            await older.click()
            await older.wait_for(state="hidden", timeout=MS)  # the start of the stream
            shown = [r["id"] for r in await _shown(page)]
            assert shown == await stream_ids(shown[0], 10_000) and set(newest_first) <= set(shown)

            # Filters: type, then job, then dataset; the history is read again with them.
            await page.select_option("#ev-type", "quarantined")
            want = [i for i, ev in reversed(history) if isinstance(ev, Quarantined)]
            await page.wait_for_function(
                "n => { const li = [...document.querySelectorAll('#events li')];"
                " return li.length === n && li.every(e => e.dataset.type === 'quarantined'); }",
                arg=len(want),
                timeout=MS,
            )
            assert [r["id"] for r in await _shown(page)] == want
            await page.fill("#ev-job", "j1")
            await page.fill("#ev-dataset", "d2")
            await page.press("#ev-dataset", "Enter")
            want = [
                i
                for i, ev in reversed(history)
                if isinstance(ev, Quarantined) and ev.job == "j1" and ev.dataset == "d2"
            ]
            assert want
            await page.wait_for_function(
                "ids => JSON.stringify([...document.querySelectorAll('#events li')].map(e => e.dataset.id))"
                " === JSON.stringify(ids)",
                arg=want,
                timeout=MS,
            )

            # Live: events that do not match never show; the one that does shows once, on top.
            await page.locator("#live.on").wait_for(timeout=MS)
            misses = [
                Quarantined(at=time.time(), dataset="d2", job="j0", reason="other job"),
                Quarantined(at=time.time(), dataset="d3", job="j1", reason="other dataset"),
                Committed(at=time.time(), dataset="d2", job="j1", files=1, bytes=1, duration_s=0.1),
            ]
            miss_ids = [(await admin.publish(ev)).decode() for ev in misses]
            hit = (
                await admin.publish(Quarantined(at=time.time(), dataset="d2", job="j1", reason="live"))
            ).decode()
            await page.locator(f'#events li[data-id="{hit}"]').wait_for(timeout=MS)
            # A second match after it: by the time it shows, the stream has passed every miss.
            last = (
                await admin.publish(Quarantined(at=time.time(), dataset="d2", job="j1", reason="last"))
            ).decode()
            await page.locator(f'#events li[data-id="{last}"]').wait_for(timeout=MS)
            shown = [r["id"] for r in await _shown(page)]
            assert shown == [last, hit, *want], shown
            assert not set(miss_ids) & set(shown)
            assert "reason=live" in await page.locator(f'#events li[data-id="{hit}"]').inner_text()

            # A name no event can carry: the server's reason, no list, no live stream.
            await page.fill("#ev-dataset", "../x")
            await page.press("#ev-dataset", "Enter")
            await page.locator("#events-note.error", has_text="dataset").wait_for(timeout=MS)
            assert await page.locator("#events li").count() == 0
            # Cleared filters: every event again, the live ones included, each once.
            await page.fill("#ev-dataset", "")
            await page.fill("#ev-job", "")
            await page.select_option("#ev-type", "")
            await page.locator(f'#events li[data-id="{miss_ids[0]}"]').wait_for(timeout=MS)
            ids = [r["id"] for r in await _shown(page)]
            ours = set(miss_ids) | {hit, last}
            assert [i for i in ids if i in ours] == [last, hit, *miss_ids[::-1]]
            assert len(ids) == len(set(ids)) == PAGE
        except Error as exc:
            raise AssertionError(f"browser: {exc}\n{problems}") from None
        finally:
            await browser.close()
    # The refused filter's 400 is logged by the browser as a failed resource: that one only.
    assert all("400" in p for p in problems), problems
