"""A stop that comes while intake is paused (its shard's queue full) ends within worker.drain_grace.

Found from outside: the session's intake waited for room in the queue without
looking at ``stopping``, and the drain (with its ``drain_grace`` clock) began
only after it: a worker told to stop with a full queue ended when the runner
watchdog cancelled it (about 32 s with a 2 s grace), leaving its in-flight
board behind. Also: a drained worker leaves no entry on its board (a work
cancelled by the drain used to stay there as ``running``).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis.asyncio

from shared.queue import Keys
from tests._support.checkpoints import HoldAt
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_jobs import good_job
from tests._support.wait import wait_for

GRACE = 2.0


@pytest.mark.parametrize("max_queued", [3, 1000])
async def test_a_stop_while_intake_is_paused_ends_within_the_drain_grace(
    max_queued: int,
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    settings = fleet_settings(
        redis_url,
        tmp_path / "store",
        fleet_name,
        shards=1,
        worker={"max_inflight_datasets": 1, "max_queued_work": max_queued, "drain_grace": GRACE},
    )
    hold = HoldAt("commit.locked")  # a slow commit: holds the only slot until the test says so
    async with inprocess_fleet(redis_client, settings, probe=hold) as fleet:
        store = fleet.store
        worker = fleet.worker
        worker_task = fleet.worker_tasks[0]
        try:
            pub = fleet.publisher
            names = [f"d-{i}" for i in range(10)]
            await pub.publish_many(await good_job(store, "job-a", names, 1, duplicate_attempt=False))
            await asyncio.wait_for(hold.held.wait(), 30)
            runner, _ = worker._runners[0]

            async def paused() -> bool:
                return len(runner.scheduler.queue) >= min(max_queued, len(names) - 1)

            await wait_for(paused, timeout=30, what="queue full, intake paused")
            t0 = time.monotonic()
            worker.shutdown()
            done, _ = await asyncio.wait({worker_task}, timeout=GRACE + 15)
            took = time.monotonic() - t0
            assert done, f"worker still running {took:.1f}s after shutdown (drain_grace {GRACE}s)"
        finally:
            hold.open.set()
    board = await redis_client.hgetall(Keys(fleet_name).shard_state(0, "inflight"))
    assert not board, f"the stopped worker left its in-flight board: {board}"
