"""``GET /jobs/{job}`` and ``GET /datasets/{name}`` in-process against a real Redis and a local store:
what each page shows, the job's datasets paged to the end without a repeat, names with glob characters,
and hostile names and queries (400 / 404, never 500)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import redis.asyncio

from coordinator.admin import dataset_page, job_page
from shared import BadInput, NotFound, Settings, load_settings
from shared.queue import Keys, ensure_fleet, shard_of
from shared.storage import ObjectStore, open_store
from tests._support.pages import (
    BIG,
    COMMITS,
    DATASET,
    GLOB_NAME,
    JOB,
    OPEN_SHARDS,
    OTHER_JOB,
    QUARANTINE_REASON,
    SHARDS,
    big_names,
    expected_status,
    page_server,
    seed_pages,
)

TOKEN = "t0ken-for-the-page-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def settings(redis_url: str, fleet_name: str, tmp_path: Path) -> Settings:
    return load_settings(
        env={},
        overrides={
            "fleet": {"name": fleet_name, "shards": SHARDS},
            "redis": {"url": redis_url},
            "store": {"url": (tmp_path / "store").as_uri()},
            "coordinator": {"http_port": 0, "admin_token": TOKEN},
        },
    )


@pytest.fixture
async def store(settings: Settings, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    (tmp_path / "store").mkdir()
    async with open_store(settings.store.url, settings.store) as st:
        yield st


@pytest.fixture
async def seeded(
    redis_client: redis.asyncio.Redis, fleet_name: str, settings: Settings, store: ObjectStore
) -> Keys:
    await ensure_fleet(redis_client, fleet_name, SHARDS)
    keys = Keys(fleet_name)
    await seed_pages(redis_client, keys, settings, store)
    return keys


@pytest.fixture
async def base(seeded: Keys, settings: Settings, store: ObjectStore) -> AsyncIterator[str]:
    async with page_server(settings, seeded, store) as url:
        yield url


async def _get(base: str, path: str, **params: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=AUTH) as http,
        http.get(base + path, params=params) as resp,
    ):
        return resp.status, await resp.json()


async def test_job_page_pages_every_dataset_once_with_its_state_and_result(base: str) -> None:
    status, doc = await _get(base, f"/jobs/{JOB}", limit="150")
    assert status == 200
    assert [(s["shard"], s["state"]) for s in doc["shards"]] == [
        (s, "open" if s in OPEN_SHARDS else "ended") for s in range(SHARDS)
    ]
    assert doc["liveness"]["state"] == "alive"
    assert 1.0 < doc["liveness"]["silent_s"] < 30 and doc["liveness"]["timeout_s"] == pytest.approx(300)
    seen: dict[str, dict[str, Any]] = {}
    pages = 0
    while True:
        pages += 1
        assert len(doc["datasets"]) <= 150
        for d in doc["datasets"]:
            assert d["dataset"] not in seen, f"{d['dataset']} shown twice"
            seen[d["dataset"]] = d
        if doc["next"] is None:
            break
        status, doc = await _get(base, f"/jobs/{JOB}", limit="150", cursor=doc["next"])
        assert status == 200 and "events" not in doc
    assert set(seen) == set(big_names())  # never the other job's datasets
    assert pages >= BIG // 200
    for name, d in seen.items():
        assert d["status"] == expected_status(name), name
        assert d["shard"] == shard_of(name, SHARDS)
        if d["status"] == "committed":
            assert d["result"]["files"] == 2 and d["result"]["manifest"] == f"{name}/_commits/{JOB}.json"
        elif d["status"] == "waiting":
            assert d["result"] is None


async def test_job_page_liveness_silent_and_ended(
    base: str, redis_client: redis.asyncio.Redis, seeded: Keys
) -> None:
    await redis_client.delete(seeded.job_alive(min(OPEN_SHARDS), JOB))
    _, doc = await _get(base, f"/jobs/{JOB}", limit="1")
    assert doc["liveness"]["state"] == "silent" and doc["liveness"]["beat_at"] is None
    for s in OPEN_SHARDS:
        await redis_client.hdel(seeded.shard_state(s, "jobs"), JOB)
    _, doc = await _get(base, f"/jobs/{JOB}", limit="1")
    assert doc["liveness"]["state"] == "ended"


async def test_dataset_page_shows_commits_open_work_lock_and_quarantine(base: str) -> None:
    status, doc = await _get(base, f"/datasets/{DATASET}", commits="5")
    assert status == 200
    assert doc["shard"] == shard_of(DATASET, SHARDS) and doc["owner"] == f"w{doc['shard']}@1"
    assert [(w["job"], w["status"]) for w in doc["open_work"]] == [
        ("job-q", "quarantined"),
        ("job-w", "waiting"),
    ]
    (q,) = doc["quarantined"]
    assert (q["job"], q["reason"], q["actions"]) == ("job-q", QUARANTINE_REASON, ["retry", "skip"])
    st = doc["store"]
    lock = st["lock"]
    assert (lock["holder"], lock["epoch"], lock["released"], lock["held"]) == ("worker-7", 1, True, False)
    # The newest five, newest first, from the admin stream's committed events.
    assert [c["job"] for c in st["commits"]] == [f"job-c{i:02d}" for i in range(COMMITS - 1, COMMITS - 6, -1)]
    top = st["commits"][0]
    assert (top["files"], top["bytes"], top["watermarks"]) == (
        1,
        100 + COMMITS - 1,
        {"kafka:0": 10 * (COMMITS - 1)},
    )
    assert st["watermarks"]["values"] == {"kafka:0": 10 * (COMMITS - 1)}
    # More than the stream remembers: the listing adds the older ones.
    _, doc = await _get(base, f"/datasets/{DATASET}", commits="100")
    assert sorted(c["job"] for c in doc["store"]["commits"]) == [f"job-c{i:02d}" for i in range(COMMITS)]
    assert doc["store"]["commits_listed_all"] is True


async def test_glob_characters_in_a_name_match_that_name_only(base: str) -> None:
    status, doc = await _get(
        base, "/datasets/" + GLOB_NAME.replace("?", "%3F").replace("[", "%5B").replace("]", "%5D")
    )
    assert status == 200, doc
    assert [(w["job"], w["dataset"]) for w in doc["open_work"]] == [("job-g", GLOB_NAME)]
    assert doc["quarantined"] == []


@pytest.mark.parametrize(
    ("path", "params", "code"),
    [
        ("/jobs/bad%20job", {}, 400),
        ("/jobs/" + "j" * 129, {}, 400),
        ("/jobs/.hidden", {}, 400),
        ("/jobs/a*b", {}, 400),
        (f"/jobs/{JOB}", {"limit": "0"}, 400),
        (f"/jobs/{JOB}", {"limit": "1001"}, 400),
        (f"/jobs/{JOB}", {"cursor": "9.0"}, 400),
        (f"/jobs/{JOB}", {"cursor": "x"}, 400),
        (f"/jobs/{JOB}", {"evil": "1"}, 400),
        ("/jobs/no-such-job", {}, 404),
        ("/datasets/_wal", {}, 400),
        ("/datasets/a%00b", {}, 400),
        ("/datasets/" + "d" * 129, {}, 400),
        (f"/datasets/{DATASET}", {"commits": "0"}, 400),
        (f"/datasets/{DATASET}", {"commits": "-1"}, 400),
        ("/datasets/no-such-dataset", {}, 404),
        ("/datasets/x%3Cimg%20src%3Dx%3E", {}, 404),  # a dataset name, but never a lock's: nothing known
    ],
)
async def test_hostile_names_and_queries_get_400_or_404(
    base: str, path: str, params: dict[str, str], code: int
) -> None:
    status, doc = await _get(base, path, **params)
    assert status == code, doc
    assert doc["error"]


async def test_pages_need_the_token(base: str) -> None:
    async with aiohttp.ClientSession() as http:
        for path in (f"/jobs/{JOB}", f"/datasets/{DATASET}"):
            async with http.get(base + path) as resp:
                assert resp.status == 401


async def test_the_page_functions_raise_bad_input_and_not_found(
    redis_client: redis.asyncio.Redis, seeded: Keys, settings: Settings
) -> None:
    with pytest.raises(BadInput):
        await job_page(redis_client, seeded, settings, "a/b")
    with pytest.raises(NotFound):
        await job_page(redis_client, seeded, settings, "nobody")
    with pytest.raises(BadInput):
        await dataset_page(redis_client, seeded, settings, "x/y")
    with pytest.raises(NotFound):
        await dataset_page(redis_client, seeded, settings, "nothing-here")
    # Without a store: the Redis parts, and store None.
    doc = await dataset_page(redis_client, seeded, settings, DATASET)
    assert doc["store"] is None and len(doc["open_work"]) == 2
    # The other job's page shows its datasets only.
    doc = await job_page(redis_client, seeded, settings, OTHER_JOB, limit=1000)
    names: set[str] = set()
    while True:
        names |= {d["dataset"] for d in doc["datasets"]}
        if doc["next"] is None:
            break
        doc = await job_page(redis_client, seeded, settings, OTHER_JOB, limit=1000, cursor=doc["next"])
    assert names and all(n.startswith("o") for n in names)


async def test_a_commit_under_way_shows_queued_or_running(
    redis_client: redis.asyncio.Redis, seeded: Keys, settings: Settings
) -> None:
    from workers._inflight import BOARD, InFlight, work_label

    open_names = [
        n for n in big_names() if shard_of(n, SHARDS) in OPEN_SHARDS and expected_status(n) == "waiting"
    ]
    running, queued = open_names[:2]
    for name in (running, queued):
        field = f"{JOB}/{name}"
        await redis_client.hset(
            seeded.shard_state(shard_of(name, SHARDS), "datasets"), field, b'{"v":2,"status":"committing"}'
        )
    rec = InFlight(
        work="commit", dataset=running, job=JOB, worker="w1", state="running", since=1.0, state_since=1.0
    )
    await redis_client.hset(
        seeded.shard_state(shard_of(running, SHARDS), BOARD),
        work_label(("commit", JOB, running)),
        msgspec.json.encode(rec),
    )
    states: dict[str, str] = {}
    cursor = None
    while True:
        doc = await job_page(redis_client, seeded, settings, JOB, limit=1000, cursor=cursor)
        states |= {d["dataset"]: d["state"] for d in doc["datasets"]}
        if (cursor := doc["next"]) is None:
            break
    assert (states[running], states[queued]) == ("running", "queued")
    assert states[open_names[2]] == "waiting"


@pytest.mark.parametrize("limit", [7, 333, 1000])
async def test_every_page_size_walks_each_dataset_once(
    redis_client: redis.asyncio.Redis, seeded: Keys, settings: Settings, limit: int
) -> None:
    seen: list[str] = []
    cursor = None
    while True:
        doc = await job_page(redis_client, seeded, settings, JOB, limit=limit, cursor=cursor, events=0)
        assert len(doc["datasets"]) <= limit
        seen += [d["dataset"] for d in doc["datasets"]]
        if (cursor := doc["next"]) is None:
            break
    assert sorted(seen) == sorted(big_names())
