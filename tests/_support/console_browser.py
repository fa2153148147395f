"""A headless Chromium signed in to the console (Debian's ``chromium`` driven by Playwright; none is
downloaded), for the console's browser tests."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from playwright.async_api import ConsoleMessage, Page, async_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
MS = 30_000
"""A locator's wait, in milliseconds."""


@asynccontextmanager
async def signed_in_page(
    base: str, token: str, *, expected_http_errors: bool = False
) -> AsyncIterator[tuple[Page, list[str]]]:
    """Yield a page signed in to ``base``/ui with ``token`` and the list of problems it reports
    (script errors, console errors; with ``expected_http_errors`` the browser's own line for a 4xx
    answer is not one)."""
    problems: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type != "error":
            return
        if expected_http_errors and msg.text.startswith("Failed to load resource"):
            return
        problems.append(f"console: {msg.text}")

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            await page.goto(f"{base}/ui")
            await page.fill("#token", token)
            await page.click("#login button[type=submit]")
            await page.wait_for_url(f"{base}/ui")
            yield page, problems
        finally:
            await browser.close()


__all__ = ["CHROMIUM", "MS", "signed_in_page"]
