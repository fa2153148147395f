"""``commitfleet status``'s async body: the summary, then the open jobs and datasets page by page.

What it holds at any time is the summary and one page (``GET /status/jobs`` and
``GET /status/datasets`` read the same pages): ``--all`` and ``--json`` print each
page as it comes, whatever the amount of open work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import redis.asyncio
from rich.console import Console

from coordinator.admin import OpenWorkFilter, OpenWorkPage, fleet_summary, open_jobs_page, open_work_page
from shared import Settings
from shared.queue import Keys, connect, existing_fleet

from ._status_text import print_datasets, print_head, print_jobs, print_status, print_tail

# Pages read for the first few rows at most (a page may come back short: a filter that matches little).
_FIRST_PAGES = 10
_JOBS_PAGE = 200
_DATASETS_PAGE = 1000

Page = Callable[[str | None, int], Awaitable[OpenWorkPage]]


async def _pages(read: Page, limit: int) -> AsyncIterator[list[dict[str, Any]]]:
    """Yield each non-empty page of ``read`` until the last."""
    cursor: str | None = None
    while True:
        page = await read(cursor, limit)
        if page.items:
            yield page.items
        if page.next is None:
            return
        cursor = page.next


async def _first(read: Page, n: int) -> list[dict[str, Any]]:
    """Return the first ``n`` items of ``read`` (fewer when there are fewer, or the pages run out)."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(_FIRST_PAGES):
        page = await read(cursor, n - len(items))
        items += page.items
        if page.next is None or len(items) >= n:
            break
        cursor = page.next
    return items


async def show_status(
    s: Settings, out: Console, write: Callable[[bytes], None], *, top: int | None, as_json: bool
) -> None:
    """Print the fleet's status to ``out``: the summary with the first ``top`` open jobs and pending
    datasets; ``top`` None: every one, a page at a time. ``as_json``: JSON Lines to ``write``, the
    summary first, then ``{"job": ...}`` per open job and ``{"dataset": ...}`` per open dataset.

    Raises:
        ConfigError: no such fleet, or ``fleet.shards`` disagrees with the fleet's record.
        TransientError: Redis unavailable.
    """
    r: redis.asyncio.Redis = connect(s.redis, client_name="commitfleet-cli")
    try:
        s = await existing_fleet(r, s)
        keys = Keys(s.fleet.name)
        doc = await fleet_summary(r, keys, s)

        async def jobs(cursor: str | None, limit: int) -> OpenWorkPage:
            return await open_jobs_page(r, keys, s, cursor, limit)

        def datasets(flt: OpenWorkFilter) -> Page:
            async def read(cursor: str | None, limit: int) -> OpenWorkPage:
                return await open_work_page(r, keys, s, flt, cursor, limit)

            return read

        if as_json:
            enc = msgspec.json.Encoder()
            write(enc.encode(doc) + b"\n")
            async for page in _pages(jobs, _JOBS_PAGE):
                write(b"".join(enc.encode({"job": j}) + b"\n" for j in page))
            async for page in _pages(datasets(OpenWorkFilter()), _DATASETS_PAGE):
                write(b"".join(enc.encode({"dataset": d}) + b"\n" for d in page))
            return
        pending = datasets(OpenWorkFilter(state="pending"))
        if top is not None:
            first_jobs = await _first(jobs, top)
            print_status(out, doc, top=top, jobs=first_jobs, pending=await _first(pending, top))
            return
        print_head(out, doc, top=None)
        header = True
        async for page in _pages(jobs, _JOBS_PAGE):
            print_jobs(out, page, header=header)
            header = False
        header = True
        async for page in _pages(pending, _DATASETS_PAGE):
            print_datasets(out, page, header=header)
            header = False
        print_tail(out, doc, top=None)
    finally:
        await r.aclose()


__all__ = ["show_status"]
