"""A shard's counts (``state:counts``, issue 32 item 1) agree with a full walk of its state after any
sequence of saves, retried saves, fenced saves, takeovers and a v1 migration, against a real Redis."""

from __future__ import annotations

import json
import random
from collections import Counter

import msgspec
import pytest
import redis.asyncio

from shared import Fenced
from shared.queue import Keys
from tests._support.shard_state import SHARD
from workers._core import STATUSES, DatasetState, Ended, JobMeta, ShardJobs, Status
from workers._state_store import COUNTS, Batch, ShardStateStore, dataset_fields

# Hostile dataset names: glob characters, quotes and a "status" inside the reason.
NAMES = ("d1", "d*2", 'q"s', "a[b]", "x?", "status")


async def _walked(r: redis.asyncio.Redis, keys: Keys) -> dict[str, int]:
    """Return the counts a full walk of the shard's state gives (what state:counts must hold)."""
    raw = await r.hgetall(keys.shard_state(SHARD, "datasets"))
    per = Counter(json.loads(v)["status"] for v in raw.values())
    out = {s: per.get(s, 0) for s in STATUSES}
    out["jobs"] = await r.hlen(keys.shard_state(SHARD, "jobs"))
    return out


async def _counted(r: redis.asyncio.Redis, keys: Keys) -> dict[str, int]:
    raw = {k.decode(): int(v) for k, v in (await r.hgetall(keys.shard_state(SHARD, COUNTS))).items()}
    raw.pop("gen", None)
    return {s: raw.get(s, 0) for s in (*STATUSES, "jobs")}


class _Owner:
    """One owner of the shard: its store (token) and the state it loaded."""

    def __init__(self, store: ShardStateStore, state: ShardJobs) -> None:
        self.store, self.state = store, state


async def _take_over(r: redis.asyncio.Redis, keys: Keys, epoch: int) -> _Owner:
    token = f"w{epoch}@{epoch}".encode()
    await r.set(keys.shard_state(SHARD, "owner"), token)
    store = ShardStateStore(r, keys, SHARD, token)
    return _Owner(store, await store.load())


def _change(rnd: random.Random, o: _Owner, n: int) -> tuple[Batch, list[str]]:
    """Apply one random change to ``o``'s state; return its batch and the jobs it ends."""
    state = o.state
    open_jobs = sorted(state.jobs)
    roll = rnd.random()
    if not open_jobs or roll < 0.25:
        job = f"j{n}"
        names = rnd.sample(NAMES, rnd.randint(1, 4))
        state.add_job(JobMeta(job=job, opened_at=float(n), deadline=n + 600.0, datasets={}))
        for name in names:
            state.put(job, name, DatasetState(status="open"))
        return Batch(jobs={job}, datasets={(job, d) for d in names}), []
    job = rnd.choice(open_jobs)
    meta = state.jobs[job]
    if roll < 0.4 or not meta.datasets:
        # The job ends: its datasets' records go with its record.
        batch = Batch(ended={job})
        batch.drop_datasets.extend(dataset_fields(state, job))
        state.ended[job] = Ended(status="committed", at=float(n))
        return batch, [job]
    name = rnd.choice(sorted(meta.datasets))
    status: Status = rnd.choice(STATUSES)
    state.set_status(job, name, status, reason=f'"status":"{rnd.choice(STATUSES)}" said {name}')
    return Batch(datasets={(job, name)}), []


@pytest.mark.parametrize("seed", range(6))
async def test_counts_agree_with_a_walk_of_the_state_after_a_random_walk(
    redis_client: redis.asyncio.Redis, fleet_name: str, seed: int
) -> None:
    rnd = random.Random(seed)
    keys = Keys(fleet_name)
    epoch = 1
    owner = await _take_over(redis_client, keys, epoch)
    assert await _counted(redis_client, keys) == await _walked(redis_client, keys)
    for n in range(150):
        roll = rnd.random()
        if roll < 0.07:
            epoch += 1
            owner = await _take_over(redis_client, keys, epoch)  # the new owner's load recounts
        elif roll < 0.12:
            # A former owner, fenced: it writes nothing, its counts neither.
            before = await _counted(redis_client, keys)
            stale = ShardStateStore(redis_client, keys, SHARD, b"w0@0")
            batch, _ = _change(rnd, owner, n)
            with pytest.raises(Fenced):
                await stale.save(batch, owner.state)
            assert await _counted(redis_client, keys) == before
            owner = await _take_over(redis_client, keys, epoch)  # forget the change it made in memory
        elif roll < 0.15:
            # Counts written wrong (by hand, or lost): the next owner's load puts them right.
            await redis_client.hset(keys.shard_state(SHARD, COUNTS), mapping={"waiting": 99, "jobs": -3})
            epoch += 1
            owner = await _take_over(redis_client, keys, epoch)
        else:
            batch, ending = _change(rnd, owner, n)
            await owner.store.save(batch, owner.state)
            if rnd.random() < 0.3:
                await owner.store.save(batch, owner.state)  # retried (the reply was lost): no change
            for job in ending:
                owner.state.end_job(job, "committed", float(n))
        assert await _counted(redis_client, keys) == await _walked(redis_client, keys), (seed, n)


async def test_a_v1_shard_is_counted_once_migrated(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    await redis_client.set(keys.shard_state(SHARD, "owner"), b"w1@1")
    v1 = {
        "v": 1,
        "job": "old",
        "opened_at": 1.0,
        "deadline": 600.0,
        "datasets": {
            "a": {"status": "waiting", "expected": None, "reason": ""},
            "b": {"status": "quarantined", "expected": None, "reason": ""},
        },
    }
    await redis_client.hset(keys.shard_state(SHARD, "jobs"), "old", json.dumps(v1))
    # A dataset record of no open job: dropped by the migration's save, and not counted.
    orphan = msgspec.json.encode(DatasetState(status="blocked"))
    await redis_client.hset(keys.shard_state(SHARD, "datasets"), "gone/c", orphan)
    await ShardStateStore(redis_client, keys, SHARD, b"w1@1").load()
    counted = await _counted(redis_client, keys)
    assert counted == await _walked(redis_client, keys)
    assert (counted["waiting"], counted["quarantined"], counted["blocked"], counted["jobs"]) == (1, 1, 0, 1)
    # A fenced load writes nothing.
    before = await redis_client.hgetall(keys.shard_state(SHARD, COUNTS))
    with pytest.raises(Fenced):
        await ShardStateStore(redis_client, keys, SHARD, b"w0@0").load()
    assert await redis_client.hgetall(keys.shard_state(SHARD, COUNTS)) == before
