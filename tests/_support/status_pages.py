"""The status summary with its open work read whole, page by page, for tests that check a small fleet."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio

from coordinator.admin import OpenWorkFilter, fleet_summary, open_jobs_page, open_work_page
from shared import Settings
from shared.queue import Keys

PENDING = ("waiting", "committing", "aborting", "blocked")


async def status_with_pages(r: redis.asyncio.Redis, keys: Keys, settings: Settings) -> dict[str, Any]:
    """Return the summary (``fleet_summary``) plus ``open_jobs`` (every GET /status/jobs item) and
    ``datasets`` / ``pending`` (every open / pending GET /status/datasets item)."""
    doc = await fleet_summary(r, keys, settings)
    jobs: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await open_jobs_page(r, keys, settings, cursor, 200)
        jobs += page.items
        if (cursor := page.next) is None:
            break
    datasets: list[dict[str, Any]] = []
    while True:
        page = await open_work_page(r, keys, settings, OpenWorkFilter(), cursor, 1000)
        datasets += page.items
        if (cursor := page.next) is None:
            break
    doc["open_jobs"] = jobs
    doc["datasets"] = datasets
    doc["pending"] = [d for d in datasets if d["status"] in PENDING]
    return doc


def parse_status_json(text: str) -> dict[str, Any]:
    """Return ``commitfleet status --json``'s JSON Lines as one dict: the summary (first line) plus
    ``open_jobs`` (the ``{"job": ...}`` lines), ``datasets`` (the ``{"dataset": ...}`` lines) and
    ``pending`` (those waiting, committing, aborting or blocked)."""
    lines = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    doc: dict[str, Any] = lines[0]
    doc["open_jobs"] = [ln["job"] for ln in lines[1:] if "job" in ln]
    doc["datasets"] = [ln["dataset"] for ln in lines[1:] if "dataset" in ln]
    assert len(doc["open_jobs"]) + len(doc["datasets"]) == len(lines) - 1, "a line of another kind"
    doc["pending"] = [d for d in doc["datasets"] if d["status"] in PENDING]
    return doc
