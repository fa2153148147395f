"""Open work, paged (coordinator/admin/_open_work.py) against a real Redis: every entry exactly once
across the pages, for each filter, with dataset names full of glob characters; bounded pages."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio

from coordinator.admin import OpenWorkFilter, open_jobs_page, open_work_page
from shared import BadInput, Settings
from shared.queue import Keys, shard_of
from tests._support.fleet import fleet_settings
from workers import DatasetState, JobMeta

SHARDS = 4
STATUSES = ("open", "waiting", "committing", "aborting", "blocked", "quarantined", "committed", "aborted")
# Job ids are [A-Za-z0-9_.-] and dataset names may hold * ? [ ] (not / or a backslash) when they come
# through the queue; a record written by hand may hold anything but a "/" in its job: these hold all.
JOBS = ("j1", "j.2", "J-3_x", "jx", "j*", "j?[1]\\")
STEMS = ("a*b", "a?c", "[ab]", "a[", "]z", "ab", "a", "x*", "*", "?", "a.b", "ab*[?]", "a\\b", "\\")


def _population(n: int, seed: int) -> dict[tuple[str, str], str]:
    """Return (job, dataset) -> status for ``n`` datasets named after the stems (so names share prefixes)."""
    rnd = random.Random(seed)
    out: dict[tuple[str, str], str] = {}
    while len(out) < n:
        name = rnd.choice(STEMS) + (str(rnd.randrange(200)) if rnd.random() < 0.8 else "")
        out[(rnd.choice(JOBS), name)] = rnd.choice(STATUSES)
    return out


async def _write(r: redis.asyncio.Redis, keys: Keys, pop: dict[tuple[str, str], str]) -> None:
    enc = msgspec.json.Encoder()
    async with r.pipeline(transaction=False) as pipe:
        for (job, name), status in pop.items():
            key = keys.shard_state(shard_of(name, SHARDS), "datasets")
            pipe.hset(key, f"{job}/{name}", enc.encode(DatasetState(status=status, reason=f"why {name}")))  # type: ignore[arg-type]
        await pipe.execute()


async def _all_pages(
    r: redis.asyncio.Redis, keys: Keys, s: Settings, flt: OpenWorkFilter, limit: int
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(10_000):
        page = await open_work_page(r, keys, s, flt, cursor, limit)
        assert len(page.items) <= limit
        items += page.items
        if page.next is None:
            return items
        cursor = page.next
    raise AssertionError("the pages never ended")


def _expected(pop: dict[tuple[str, str], str], flt: OpenWorkFilter) -> list[tuple[str, str]]:
    out = []
    for (job, name), status in pop.items():
        if flt.job is not None and job != flt.job:
            continue
        if flt.dataset is not None and name != flt.dataset:
            continue
        if flt.prefix is not None and not name.startswith(flt.prefix):
            continue
        if flt.shard is not None and shard_of(name, SHARDS) != flt.shard:
            continue
        if flt.state is None and status in ("committed", "aborted"):
            continue
        # Nothing is in flight here: a commit or an abort under way is queued.
        if flt.state == "queued" and status not in ("committing", "aborting"):
            continue
        if flt.state == "pending" and status not in ("waiting", "committing", "aborting", "blocked"):
            continue
        if flt.state not in (None, "queued", "pending") and status != flt.state:
            continue
        out.append((job, name))
    return sorted(out)


FILTERS = [
    OpenWorkFilter(),
    OpenWorkFilter(job="j.2"),
    OpenWorkFilter(prefix="a*"),
    OpenWorkFilter(prefix="["),
    OpenWorkFilter(prefix="a?"),
    OpenWorkFilter(prefix="*"),
    OpenWorkFilter(job="jx", prefix="ab*"),
    OpenWorkFilter(dataset="a*b1"),
    OpenWorkFilter(dataset="[ab]"),
    OpenWorkFilter(dataset="*", job="j1"),
    OpenWorkFilter(job="j*"),
    OpenWorkFilter(job="j?[1]\\", prefix="a\\"),
    OpenWorkFilter(prefix="\\"),
    OpenWorkFilter(state="waiting"),
    OpenWorkFilter(state="queued"),
    OpenWorkFilter(state="pending"),
    OpenWorkFilter(state="committed"),
    OpenWorkFilter(shard=2),
    OpenWorkFilter(shard=1, state="blocked", prefix="a"),
]


@pytest.mark.parametrize("size", [40, 1500])  # small hashes answer whole; large ones in many replies
async def test_every_entry_exactly_once_per_filter(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path, size: int
) -> None:
    s = fleet_settings(redis_url, tmp_path, fleet_name, shards=SHARDS)
    keys = Keys(fleet_name)
    pop = _population(size, seed=size)
    await _write(redis_client, keys, pop)
    for flt in FILTERS:
        want = _expected(pop, flt)
        for limit in (1, 7, 100, 1000):
            got = await _all_pages(redis_client, keys, s, flt, limit)
            pairs = [(i["job"], i["dataset"]) for i in got]
            assert len(pairs) == len(set(pairs)), (flt, limit, "an entry came twice")
            assert sorted(pairs) == want, (flt, limit)
            for i in got:
                status = pop[(i["job"], i["dataset"])]
                assert i["status"] == status and i["shard"] == shard_of(i["dataset"], SHARDS)
                assert i["reason"] == f"why {i['dataset']}"


async def test_a_page_is_bounded_and_a_bad_cursor_or_limit_is_refused(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    s = fleet_settings(redis_url, tmp_path, fleet_name, shards=SHARDS)
    keys = Keys(fleet_name)
    await _write(redis_client, keys, {("j1", f"d{i}"): "waiting" for i in range(3000)})
    page = await open_work_page(redis_client, keys, s, OpenWorkFilter(), None, 1000)
    assert len(page.items) == 1000 and page.next is not None
    # A filter that matches nothing: each page examines a bounded part of the state, and the pages end.
    seen = 0
    cursor: str | None = None
    while True:
        empty = await open_work_page(redis_client, keys, s, OpenWorkFilter(prefix="zz"), cursor, 10)
        assert empty.items == []
        seen += 1
        if empty.next is None:
            break
        cursor = empty.next
    assert seen < 100
    for bad in ("", "nonsense", "W1swLDAsbnVsbF0", page.next[:-3]):
        with pytest.raises(BadInput):
            await open_work_page(redis_client, keys, s, OpenWorkFilter(), bad or "=", 10)
    for limit in (0, 1001):
        with pytest.raises(BadInput):
            await open_work_page(redis_client, keys, s, OpenWorkFilter(), None, limit)
    with pytest.raises(BadInput):
        await open_work_page(redis_client, keys, s, OpenWorkFilter(state="sleeping"), None, 10)
    with pytest.raises(BadInput):
        await open_work_page(redis_client, keys, s, OpenWorkFilter(shard=SHARDS), None, 10)
    # A dataset's own shard only: a shard filter naming another finds nothing.
    other = (shard_of("d1", SHARDS) + 1) % SHARDS
    assert (
        await open_work_page(redis_client, keys, s, OpenWorkFilter(dataset="d1", shard=other), None, 10)
    ).items == []


@pytest.mark.parametrize("jobs", [30, 700])
async def test_open_jobs_page_lists_each_job_once_with_its_shards(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path, jobs: int
) -> None:
    s = fleet_settings(redis_url, tmp_path, fleet_name, shards=SHARDS)
    keys = Keys(fleet_name)
    rnd = random.Random(jobs)
    want: dict[str, list[int]] = {}
    enc = msgspec.json.Encoder()
    for i in range(jobs):
        job = f"job-{i}"
        on = sorted(rnd.sample(range(SHARDS), rnd.randint(1, SHARDS)))
        want[job] = on
        for shard in on:
            meta = JobMeta(job=job, opened_at=float(i), deadline=i + 60.0)
            await redis_client.hset(keys.shard_state(shard, "jobs"), job, enc.encode(meta))
    await redis_client.hset(keys.shard_state(1, "jobs"), "bad", b"{")  # left out, not fatal
    got: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await open_jobs_page(redis_client, keys, s, cursor, 17)
        assert len(page.items) <= 17
        got += page.items
        if page.next is None:
            break
        cursor = page.next
    assert sorted(j["job"] for j in got) == sorted(want), "each job exactly once"
    for j in got:
        assert j["shards"] == want[j["job"]]
        assert j["deadline"] - j["opened_at"] == 60.0
