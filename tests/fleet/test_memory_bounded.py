"""Memory follows open work: after a drained backlog nothing of the history is left (the small soak).

A coordinator and one worker in-process commit a backlog of jobs (N datasets
x a few tasks), then the test checks what is left once everything is committed:
the shard streams trimmed to nothing, no per-dataset structure left in the
worker, no open-job or attempt record in Redis. The long form with RSS and
Redis memory figures is ``python -m tests.bench.soak``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio

from coordinator import Coordinator
from shared.queue import AsyncPublisher, Keys, ensure_fleet
from shared.storage import open_store
from tests._support.wait import wait_for
from workers import Worker

from ._helpers import fleet_settings, good_job

DATASETS = 1000
PER_JOB = 250
TASKS = 4
SHARDS = 4


async def test_a_drained_backlog_leaves_no_history(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=SHARDS, queue={"trim_interval": 0.2}
    )
    keys = Keys(fleet_name)
    coord = Coordinator(settings, coordinator_id="c1")
    worker = Worker(settings, worker_id="w1")
    async with open_store(settings.store.url, settings.store) as store, asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(x.run()) for x in (coord, worker)]
        try:
            await ensure_fleet(redis_client, fleet_name, SHARDS)
            pub = AsyncPublisher(redis_client, fleet_name, SHARDS)
            published = 0
            for start in range(0, DATASETS, PER_JOB):
                names = [f"ds{i}" for i in range(start, start + PER_JOB)]
                events = await good_job(store, f"job{start}", names, tasks=TASKS, duplicate_attempt=False)
                await pub.publish_many(events)
                published += len(events)

            async def all_committed() -> bool:
                return int(await redis_client.hget(keys.outcome_counts, "committed") or 0) == DATASETS

            await wait_for(all_committed, timeout=120, what=f"{DATASETS} commits")

            async def streams_trimmed() -> bool:
                return all([await redis_client.xlen(keys.events(s)) == 0 for s in range(SHARDS)])

            # Every acknowledged entry leaves its stream on the owner's next trim.
            await wait_for(streams_trimmed, timeout=30, what="shard streams trimmed")
            runners = [runner for runner, _task in worker._runners.values()]
            assert len(runners) == SHARDS

            async def pruned() -> bool:
                return all(
                    len(r._ds_locks) == 0 and not r._running and not r._tasks and not r.state.jobs
                    for r in runners
                )

            await wait_for(pruned, timeout=30, what="per-dataset structures dropped")
            for r in runners:
                assert not r.state.attempts  # attempts leave with their job
                assert set(r.state.ended) <= {f"job{s}" for s in range(0, DATASETS, PER_JOB)}
            for s in range(SHARDS):
                assert await redis_client.hlen(keys.shard_state(s, "jobs")) == 0
                assert await redis_client.hlen(keys.shard_state(s, "attempts")) == 0
                assert await redis_client.hlen(keys.shard_state(s, "inflight")) == 0
                groups = await redis_client.xinfo_groups(keys.events(s))
                assert [int(g["pending"]) for g in groups] == [0]
            # The group kept its place: a new job after the full trim is still delivered and committed.
            await pub.publish_many(
                await good_job(store, "job-late", ["late"], tasks=TASKS, duplicate_attempt=False)
            )
            await wait_for(
                lambda: _committed(redis_client, keys, DATASETS + 1),
                timeout=60,
                what="the late job committed",
            )
            assert published > DATASETS * TASKS
        finally:
            for x in (worker, coord):
                x.shutdown()
        await asyncio.gather(*tasks)


async def _committed(r: redis.asyncio.Redis, keys: Keys, n: int) -> bool:
    return int(await r.hget(keys.outcome_counts, "committed") or 0) == n
