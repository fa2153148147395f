"""Memory follows open work: after a drained backlog nothing of the history is left (the small soak).

A coordinator and one worker in-process commit a backlog of jobs (N datasets
x a few tasks), then the test checks what is left once everything is committed:
the shard streams trimmed to nothing, no per-dataset structure left in the
worker, no open-job or attempt record in Redis, and the history kept on
purpose (the admin outcome markers) within its cap. The long form with RSS
and Redis memory figures is ``python -m tests.bench.soak``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio

from coordinator import Coordinator
from shared.events import Committed
from shared.queue import AdminPublisher, AsyncPublisher, Keys, as_text, ensure_fleet
from shared.storage import open_store
from tests._support.wait import wait_for
from workers import Worker

from ._helpers import fleet_settings, good_job

DATASETS = 1000
PER_JOB = 250
TASKS = 4
SHARDS = 4
MARKERS_MAX = 600


async def test_a_drained_backlog_leaves_no_history(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(
        redis_url,
        tmp_path / "store",
        fleet_name,
        shards=SHARDS,
        queue={"trim_interval": 0.2, "outcome_markers_max": MARKERS_MAX},
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
                    r.scheduler.queue.datasets == 0
                    and not r.scheduler.running
                    and not r.scheduler.tasks
                    and not r.ledger.state.jobs
                    for r in runners
                )

            await wait_for(pruned, timeout=30, what="per-dataset structures dropped")
            for r in runners:
                assert not r.ledger.state.attempts  # attempts leave with their job
                assert set(r.ledger.state.ended) <= {f"job{s}" for s in range(0, DATASETS, PER_JOB)}

            async def boards_empty() -> bool:  # the board is written behind (workers._inflight)
                return all(
                    [await redis_client.hlen(keys.shard_state(s, "inflight")) == 0 for s in range(SHARDS)]
                )

            await wait_for(boards_empty, timeout=10, what="in-flight boards emptied")
            for s in range(SHARDS):
                assert await redis_client.hlen(keys.shard_state(s, "jobs")) == 0
                assert await redis_client.hlen(keys.shard_state(s, "attempts")) == 0
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
            # Outcome markers are history kept on purpose, within their cap: the newest ones.
            assert await redis_client.hlen(keys.outcome_markers) == MARKERS_MAX
            assert await redis_client.xlen(keys.outcome_order) == MARKERS_MAX
            assert await redis_client.hexists(keys.outcome_markers, "late/job-late")
            assert not await redis_client.hexists(keys.outcome_markers, "ds0/job0")
        finally:
            for x in (worker, coord):
                x.shutdown()
        await asyncio.gather(*tasks)


async def _committed(r: redis.asyncio.Redis, keys: Keys, n: int) -> bool:
    return int(await r.hget(keys.outcome_counts, "committed") or 0) == n


async def test_outcome_markers_are_capped_by_count_and_age(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    admin = AdminPublisher(redis_client, keys, markers_max=5)

    async def announce(pub: AdminPublisher, dataset: str, job: str = "j") -> bool:
        ev = Committed(
            at=1.0, worker="w", dataset=dataset, job=job, files=1, bytes=1, duration_s=0.0, epoch=1
        )
        return await pub.publish_outcome(ev, dataset=dataset, job=job, outcome="committed")

    for i in range(20):
        assert await announce(admin, f"d{i}")
    fields = {as_text(f) for f in await redis_client.hkeys(keys.outcome_markers)}
    assert fields == {f"d{i}/j" for i in range(15, 20)}
    assert await redis_client.xlen(keys.outcome_order) == 5
    assert not await announce(admin, "d19")  # within the cap: still announced once
    assert await redis_client.hget(keys.outcome_counts, "committed") == b"20"
    # A marker an older version wrote (a key of its own) still counts.
    await redis_client.set(keys.outcome_marker("old", "j"), "committed 1-0", ex=60)
    assert not await announce(admin, "old")
    # Age: with a 1 s retention, the next announcements forget what is older than that.
    short = AdminPublisher(redis_client, keys, markers_max=1000, marker_retention_s=1)
    assert await announce(short, "aged")
    n = 0

    async def aged_forgotten() -> bool:
        nonlocal n
        n += 1
        await announce(short, f"new{n}")
        return not await redis_client.hexists(keys.outcome_markers, "aged/j")

    await wait_for(aged_forgotten, timeout=10, interval=0.1, what="the aged marker forgotten")
    assert await redis_client.hexists(keys.outcome_markers, f"new{n}/j")
