"""The status summary (``fleet_summary``, GET /status) comes from the shards' counts: its size does
not depend on the open work, its totals are exact, and "open jobs" counts jobs, not (job, shard) records."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import redis.asyncio

from coordinator.admin import OpenJobs, fleet_summary
from shared.queue import Keys, shard_of
from tests._support.fleet import fleet_settings
from workers._core import DatasetState, JobMeta, ShardJobs, Status
from workers._state_store import Batch, ShardStateStore

SHARDS = 4
OPEN: tuple[Status, ...] = ("open", "waiting", "committing", "aborting", "blocked", "quarantined")


async def _populate(r: redis.asyncio.Redis, keys: Keys, datasets: int, jobs: int, seed: int) -> Counter[str]:
    """Open ``jobs`` jobs over ``datasets`` datasets through each shard owner's saves; return the
    statuses written."""
    rnd = random.Random(seed)
    per_shard: dict[int, list[tuple[str, str, Status]]] = {}
    written: Counter[str] = Counter()
    for i in range(datasets):
        name, job, status = f"ds-{i}", f"job-{i % jobs}", rnd.choice(OPEN)
        per_shard.setdefault(shard_of(name, SHARDS), []).append((job, name, status))
        written[status] += 1
    for shard, rows in per_shard.items():
        token = f"w1@{shard}".encode()
        await r.set(keys.shard_state(shard, "owner"), token)
        store = ShardStateStore(r, keys, shard, token)
        state: ShardJobs = await store.load()
        batch = Batch()
        for job, name, status in rows:
            if job not in state.jobs:
                state.add_job(JobMeta(job=job, opened_at=1.0, deadline=601.0, datasets={}))
                batch.jobs.add(job)
            state.put(job, name, DatasetState(status=status, reason="r"))
            batch.datasets.add((job, name))
        await store.save(batch, state)
    return written


def _shape(doc: dict[str, object]) -> str:
    """Return ``doc`` as JSON with every number (and the fleet's name) made the same."""
    text = json.dumps({k: v for k, v in doc.items() if k != "fleet"}, sort_keys=True)
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "0", text)


async def test_summary_size_does_not_grow_with_open_datasets(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    docs = []
    for datasets, jobs in ((100, 10), (5000, 10)):
        name = f"{fleet_name}x{datasets}"
        keys = Keys(name)
        s = fleet_settings(redis_url, tmp_path, name, shards=SHARDS)
        written = await _populate(redis_client, keys, datasets, jobs, seed=datasets)
        doc = await fleet_summary(redis_client, keys, s)
        t = doc["totals"]
        assert t["open_jobs"] == jobs, "jobs, not (job, shard) records"
        assert sum(r["open_jobs"] for r in doc["shard_table"]) > jobs  # each job spans shards
        assert t["datasets"] == datasets
        assert (t["waiting"], t["blocked"]) == (written["waiting"], written["blocked"])
        # Nothing in flight: every commit and abort due is queued.
        assert (t["queued"], t["running"]) == (written["committing"] + written["aborting"], 0)
        assert t["quarantined"] == written["quarantined"]
        for row in doc["shard_table"]:
            assert sum(row["statuses"].values()) == row["datasets"]
        docs.append(doc)
    small, large = (_shape(d) for d in docs)
    assert small == large, "the summary's shape depends on the open work"
    sizes = [len(json.dumps(d)) for d in docs]
    assert abs(sizes[0] - sizes[1]) < 200, sizes  # only the digits of the counts differ


async def test_open_jobs_are_recounted_when_a_shard_gen_moves(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    keys = Keys(fleet_name)
    s = fleet_settings(redis_url, tmp_path, fleet_name, shards=SHARDS)
    await _populate(redis_client, keys, 40, 4, seed=1)
    jobs = OpenJobs()
    assert (await fleet_summary(redis_client, keys, s, jobs))["totals"]["open_jobs"] == 4
    # A record written behind the owners' back (no gen moved): the last count stands...
    raw = json.dumps({"v": 2, "job": "by-hand", "opened_at": 1.0, "deadline": 2.0})
    await redis_client.hset(keys.shard_state(0, "jobs"), "by-hand", raw)
    assert (await fleet_summary(redis_client, keys, s, jobs))["totals"]["open_jobs"] == 4
    # ...a new count sees it; the kept one walks again only a shard whose gen moved: another shard's
    # save adds its own job, and the hand-written record counts once its own shard's owner loads.
    assert (await fleet_summary(redis_client, keys, s))["totals"]["open_jobs"] == 5
    store = ShardStateStore(redis_client, keys, 1, b"w1@1")
    state = await store.load()  # the load's recount moves the gen too
    state.add_job(JobMeta(job="job-new", opened_at=1.0, deadline=2.0, datasets={}))
    await store.save(Batch(jobs={"job-new"}), state)
    assert (await fleet_summary(redis_client, keys, s, jobs))["totals"]["open_jobs"] == 5
    await ShardStateStore(redis_client, keys, 0, b"w1@0").load()  # the owner _populate set
    assert (await fleet_summary(redis_client, keys, s, jobs))["totals"]["open_jobs"] == 6
    # A record that does not decode is listed, not counted, and does not fail the summary.
    await redis_client.hset(keys.shard_state(2, "jobs"), "bad", b"{")
    doc = await fleet_summary(redis_client, keys, s)
    assert [(u["shard"], u["field"]) for u in doc["unreadable"]] == [(2, "bad")]
    assert doc["unreadable_count"] == 1 and doc["totals"]["open_jobs"] == 6
