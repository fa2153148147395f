"""Job results are capped per shard (``queue.results_max``); a forgotten result is reported, not waited for.

The cap is kept by the shard state's save script itself (the one that writes a
result), oldest first; a reader that finds no result for a dataset of a job
that has ended on its shard knows the answer will not come (``forgotten``):
``wait_for_outcome`` raises ``OutcomeForgotten`` at once, and ``commitfleet
wait`` exits 4, instead of waiting out their timeouts.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio

from coordinator.cli._wait import EXIT_FORGOTTEN, exit_code, outcome_rows
from shared.queue import DatasetResult, Keys, ensure_fleet, read_outcome
from shared.queue._job_outcome import ResultStatus
from shared.spark import OutcomeForgotten, ProducerConfig
from shared.spark._outcome import wait_for_outcome
from tests._support.routing import datasets_on
from workers._core import Ended, ShardJobs
from workers._state_store import RESULTS_INDEX, Batch, ShardStateStore

SHARDS = 4
CAP = 5


async def _store(r: redis.asyncio.Redis, keys: Keys, shard: int) -> ShardStateStore:
    await r.set(keys.shard_state(shard, "owner"), b"w1@1")
    return ShardStateStore(r, keys, shard, b"w1@1", results_max=CAP)


async def _end_job(
    store: ShardStateStore, job: str, datasets: list[str], status: ResultStatus = "committed"
) -> None:
    """Save what a worker saves when the last dataset of ``job`` is done: results, and the job ended."""
    state = ShardJobs()
    state.ended[job] = Ended(status="committed", at=time.time())
    batch = Batch(ended={job})
    for d in datasets:
        batch.results[(job, d)] = DatasetResult(status=status, files=1, manifest=f"{d}/_commits/{job}.json")
    await store.save(batch, state)


async def _kept(r: redis.asyncio.Redis, keys: Keys, shard: int, jobs: list[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for job in jobs:
        fields = {f.decode() for f in await r.hkeys(keys.job_result(shard, job))}
        if fields:
            out[job] = fields
    return out


async def test_results_beyond_the_cap_are_forgotten_oldest_first(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    shard = 1
    store = await _store(redis_client, keys, shard)
    names = datasets_on(shard, SHARDS, 12, width=4)
    jobs = [f"job-{i}" for i in range(4)]
    for i, job in enumerate(jobs):
        await _end_job(store, job, names[3 * i : 3 * i + 3])
        kept = await _kept(redis_client, keys, shard, jobs)
        # The cap holds after every save: the hashes and their age order agree.
        assert sum(len(v) for v in kept.values()) == min(CAP, 3 * (i + 1)), kept
        assert await redis_client.zcard(keys.shard_state(shard, RESULTS_INDEX)) == min(CAP, 3 * (i + 1))
    # The newest five: all of the last job's, two of the one before; the oldest jobs' are gone.
    assert kept == {"job-3": set(names[9:12]), "job-2": set(names[6:9]) - {names[6]}}, kept


async def test_a_rewritten_result_counts_as_new_and_stale_index_entries_are_dropped(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    shard = 2
    store = await _store(redis_client, keys, shard)
    index = keys.shard_state(shard, RESULTS_INDEX)
    a, *others = datasets_on(shard, SHARDS, 6, width=4)
    await _end_job(store, "job-a", [a], status="quarantined")
    await _end_job(store, "job-b", others[:3])
    await _end_job(store, "job-a", [a])  # the operator's retry committed it: written again, now the newest
    await _end_job(store, "job-c", others[3:5])  # six written in all: one over the cap
    kept = await _kept(redis_client, keys, shard, ["job-a", "job-b", "job-c"])
    assert kept == {"job-a": {a}, "job-b": set(others[1:3]), "job-c": set(others[3:5])}, kept
    raw = await redis_client.hget(keys.job_result(shard, "job-a"), a)
    assert raw is not None and b'"committed"' in raw
    # An entry older than the results' retention is dropped, with its result, by the next save.
    await redis_client.zadd(index, {f"job-a\n{a}": 0})
    await _end_job(store, "job-d", [])
    assert not await redis_client.hexists(keys.job_result(shard, "job-a"), a)
    assert await redis_client.zcard(index) == 4


async def test_a_forgotten_result_is_reported_at_once_not_waited_for(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    await ensure_fleet(redis_client, fleet_name, SHARDS)
    shard = 3
    store = await _store(redis_client, keys, shard)
    old = datasets_on(shard, SHARDS, 2, prefix="old", width=4)
    await _end_job(store, "job-old", old)
    new = datasets_on(shard, SHARDS, CAP, prefix="new", width=4)
    await _end_job(store, "job-new", new)  # pushes both of job-old's results out
    open_ds = datasets_on(
        shard, SHARDS, 1, prefix="open", width=4
    )  # a job still open there: no result yet, not ended

    outcome = await read_outcome(redis_client, keys, SHARDS, "job-old", old)
    assert outcome.results == {} and outcome.missing == () and outcome.forgotten == tuple(old)
    assert outcome.done and not outcome.ok
    assert exit_code(outcome, True) == EXIT_FORGOTTEN == 4
    assert {r["status"] for r in outcome_rows(outcome)} == {"unknown"}
    still_open = await read_outcome(redis_client, keys, SHARDS, "job-open", open_ds)
    assert still_open.missing == tuple(open_ds) and not still_open.done

    cfg = ProducerConfig(redis_url=redis_url, store_url="file:///none", fleet=fleet_name, shards=SHARDS)
    # A long timeout: the call must end on the forgotten results, not on its deadline.
    with pytest.raises(OutcomeForgotten) as info:
        await asyncio.to_thread(wait_for_outcome, cfg, "job-old", old, 600.0)
    assert info.value.forgotten == tuple(old)
    assert "queue.results_max" in str(info.value)
    results = await asyncio.to_thread(wait_for_outcome, cfg, "job-new", new, 600.0)
    assert {r.status for r in results.values()} == {"committed"}
