"""The console's job and dataset pages in a real headless Chromium.

The admin API and console served in-process over a real Redis and a local store holding a seeded fleet
state (tests/_support/pages.py): the header's search box opens a job's page (liveness, shards, one page
of its datasets, next page), a dataset link in the quarantined table opens the dataset's page (lock,
commits, open work, quarantine with a reason full of markup, shown as text), its Retry button queues the
operator request, a job link in the events panel opens that job; bad and unknown names show the
server's reason and never run markup. Screenshots of both views are kept in ``test-artifacts/``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
import redis.asyncio

from shared import load_settings
from shared.queue import Keys, ensure_fleet, shard_of
from shared.storage import open_store
from tests._support.console_browser import MS, signed_in_page
from tests._support.pages import (
    COMMITS,
    DATASET,
    GLOB_NAME,
    JOB,
    QUARANTINE_REASON,
    SHARDS,
    page_server,
    seed_pages,
)

pytestmark = pytest.mark.browser

TOKEN = "console-pages-token-0123456789"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


async def test_job_and_dataset_pages(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    (tmp_path / "store").mkdir()
    s = load_settings(
        env={},
        overrides={
            "fleet": {"name": fleet_name, "shards": SHARDS},
            "redis": {"url": redis_url},
            "store": {"url": (tmp_path / "store").as_uri()},
            "coordinator": {"http_port": 0, "admin_token": TOKEN},
        },
    )
    keys = Keys(fleet_name)
    await ensure_fleet(redis_client, fleet_name, SHARDS)
    async with (
        open_store(s.store.url, s.store) as store,
        page_server(s, keys, store) as base,
    ):
        await seed_pages(redis_client, keys, s, store)
        async with signed_in_page(base, TOKEN, expected_http_errors=True) as (page, problems):
            # The search box: a job's page, one page of its datasets at a time.
            await page.select_option("#lookup-kind", "job")
            await page.fill("#lookup-name", JOB)
            await page.press("#lookup-name", "Enter")
            await page.locator("#lookup .job-datasets tbody tr").nth(99).wait_for(timeout=MS)
            assert await page.text_content("#lookup-title") == f"job {JOB}"
            assert "liveness: alive" in (await page.text_content("#lookup .liveness") or "")
            assert await page.locator("#lookup .job-shards tbody tr").count() == SHARDS
            first = await page.eval_on_selector_all(
                "#lookup .job-datasets tbody tr", "rs => rs.map(r => r.dataset.dataset)"
            )
            assert len(first) == 100
            await page.click("#lookup .next-page")
            await page.locator("#lookup .first-page").wait_for(timeout=MS)
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "console-job.png"))
            second = await page.eval_on_selector_all(
                "#lookup .job-datasets tbody tr", "rs => rs.map(r => r.dataset.dataset)"
            )
            assert len(second) == 100 and not set(first) & set(second)

            # The quarantined table's dataset link: the dataset's page.
            link = page.locator(f"#quarantined a.open-dataset[data-name='{DATASET}']")
            await link.wait_for(timeout=MS)
            await link.click()
            await page.wait_for_function(
                "t => document.getElementById('lookup-title').textContent === t", arg=f"dataset {DATASET}"
            )
            await page.locator("#lookup .ds-commits tbody tr").nth(9).wait_for(timeout=MS)
            assert page.url.endswith(f"#dataset={DATASET}")
            assert await page.locator("#lookup .ds-commits tbody tr").count() == 10
            assert await page.text_content("#lookup .ds-commits tbody tr td") == f"job-c{COMMITS - 1:02d}"
            lock = await page.text_content("#lookup .ds-lock") or ""
            assert "released" in lock and "worker-7" in lock and "epoch 1" in lock
            assert await page.locator("#lookup .ds-open tbody tr").count() == 2
            reason = page.locator("#lookup .ds-quarantined td.reason")
            assert await reason.text_content() == QUARANTINE_REASON
            assert await page.locator("#lookup .ds-quarantined td.reason b").count() == 0  # text, not markup
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "console-dataset.png"))

            # Retry from the dataset's page: the operator request is queued for the dataset's shard.
            await page.click("#lookup .ds-quarantined button.retry")
            await page.wait_for_function(
                "() => document.getElementById('lookup-note').textContent.includes('queued for shard')",
                timeout=MS,
            )
            shard = shard_of(DATASET, SHARDS)
            assert (
                await redis_client.hget(keys.shard_state(shard, "operator"), f"{DATASET}/job-q") == b"retry"
            )

            # A job link on the dataset's page, then the back button.
            await page.click("#lookup .ds-open a.open-job[data-name='job-q']")
            await page.wait_for_function(
                "() => document.getElementById('lookup-title').textContent === 'job job-q'", timeout=MS
            )
            await page.locator("#lookup .job-datasets tbody tr[data-dataset='sales']").wait_for(timeout=MS)
            await page.go_back()
            await page.wait_for_function(
                "t => document.getElementById('lookup-title').textContent === t", arg=f"dataset {DATASET}"
            )

            # A job link in the events panel (a job no shard knows any more: its events only).
            ev_link = page.locator("#events a.open-job[data-name='job-c11']").first
            await ev_link.wait_for(timeout=MS)
            await ev_link.click()
            await page.wait_for_function(
                "() => document.getElementById('lookup-title').textContent === 'job job-c11'", timeout=MS
            )
            await page.locator("#lookup .job-events li").first.wait_for(timeout=MS)
            assert "liveness: ended" in (await page.text_content("#lookup .liveness") or "")

            # A name with glob characters, by link (hash): that dataset's work only.
            await page.goto(f"{base}/ui#dataset={quote(GLOB_NAME, safe='')}")
            await page.wait_for_function(
                "t => document.getElementById('lookup-title').textContent === t", arg=f"dataset {GLOB_NAME}"
            )
            await page.locator("#lookup .ds-open tbody tr").first.wait_for(timeout=MS)
            assert await page.locator("#lookup .ds-open tbody tr").count() == 1

            # Bad and unknown names: the server's reason, as text.
            hostile = "x<img src=x onerror=alert(1)>"
            for kind, name, needle in (
                ("dataset", "_wal", "not one safe segment"),
                ("job", "no-such-job", "not found"),
                ("dataset", hostile, "not found"),
            ):
                await page.select_option("#lookup-kind", kind)
                await page.fill("#lookup-name", name)
                await page.press("#lookup-name", "Enter")
                await page.wait_for_function(
                    "n => document.getElementById('lookup-note').textContent.includes(n)",
                    arg=needle,
                    timeout=MS,
                )
                assert await page.text_content("#lookup-title") == f"{kind} {name}"
            assert await page.locator("#lookup img").count() == 0
            await page.click("#lookup-close")
            await page.locator("#lookup").wait_for(state="hidden", timeout=MS)
            assert problems == []
