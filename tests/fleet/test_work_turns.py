"""A job whose event names many datasets does not hold back the next job of its shard.

A ``job_failed`` naming N datasets gives N aborts at once. Intake used to wait
for an in-flight slot for each of them before it read the next entry, so a
good job published a second later on the same shard was not even read before
N - slots aborts had started (seen from outside: 10,000 aborts delayed such a
commit by 68 s). Now the work is queued, intake reads on, and jobs take turns
for the slots (``workers._core._work_queue``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import redis.asyncio

from shared.events import Aborted, Committed
from tests._support.checkpoints import PermitsAt, pause_first_at
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, clean_audit, committed
from tests._support.fleet_jobs import failed_job, good_job
from tests._support.wait import wait_for

BIG = 40  # datasets of the failed job
SLOTS = 2


async def test_a_good_job_commits_between_the_aborts_of_a_big_failed_job(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    """Every abort waits at ``abort.done`` for a permit the test hands out; the good job's commit
    does not. With ``SLOTS`` slots held by aborts, the good job is read and queued at once, and
    commits after a few permits (its turn comes after one more abort), not after ``BIG`` of them.
    Then every abort is let through: each dataset ends once, aborted or committed, audit clean.
    """
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=1, worker={"max_inflight_datasets": SLOTS}
    )
    gate = PermitsAt("abort.done")
    big = [f"big-{i}" for i in range(BIG)]
    async with inprocess_fleet(redis_client, settings, probe=gate) as fleet:
        store = fleet.store
        try:
            pub = fleet.publisher
            await pub.publish_many(await failed_job(store, "job-big", big, 1))

            async def slots_held() -> bool:
                return gate.waiting == SLOTS

            await wait_for(slots_held, timeout=30, what="every slot held by an abort")
            await pub.publish_many(await good_job(store, "job-small", ["small"], 2))

            # Its turn comes after one more abort of the big job: three permits are plenty.
            for _ in range(3):
                gate.release()
            await wait_for(
                lambda: committed(store, ["small"], "job-small"),
                timeout=30,
                what="the good job committed while the failed job's aborts wait",
            )
            events = await admin_events(redis_client, fleet_name)
            assert sum(isinstance(e, Aborted) for e in events) <= 3 + SLOTS

            for _ in range(BIG):
                gate.release()

            async def all_ended() -> bool:
                evs = await admin_events(redis_client, fleet_name)
                return sum(isinstance(e, Aborted) for e in evs) >= BIG

            await wait_for(all_ended, timeout=60, what=f"{BIG} aborts")
            events = await admin_events(redis_client, fleet_name)
            ended = Counter(
                (e.dataset, type(e).__name__) for e in events if isinstance(e, Aborted | Committed)
            )
            assert ended == Counter({**{(d, "Aborted"): 1 for d in big}, ("small", "Committed"): 1})
            assert (await clean_audit(store)).ok
        finally:
            for _ in range(BIG):
                gate.release()


async def test_a_stopping_worker_runs_its_queued_work_within_the_drain_grace(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    """One slot, held by a commit paused at ``commit.locked``, and three commits queued behind it:
    the worker is told to stop, then the pause ends. The queued commits are started during the
    drain (work decided before a stop is tried before the shard is handed on), all four land, and
    the worker's run ends with nothing left queued or on the board."""
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=1, worker={"max_inflight_datasets": 1}
    )
    paused, go, probe = pause_first_at("commit.locked")
    names = [f"ds-{i}" for i in range(4)]
    async with inprocess_fleet(redis_client, settings, probe=probe) as fleet:
        store = fleet.store
        worker = fleet.worker
        worker_task = fleet.worker_tasks[0]
        try:
            pub = fleet.publisher
            await pub.publish_many(await good_job(store, "job-d", names, 1))
            await asyncio.wait_for(paused.wait(), 30)
            runner = next(r for r, _task in worker._runners.values())

            async def three_queued() -> bool:
                return len(runner.scheduler.queue) == 3

            await wait_for(three_queued, timeout=30, what="three commits queued behind the paused one")
            worker.shutdown()
            go.set()
            await asyncio.wait_for(worker_task, 60)
            assert await committed(store, names, "job-d")
            assert (
                len(runner.scheduler.queue) == 0
                and runner.scheduler.queue.datasets == 0
                and not runner.scheduler.running
            )
            events = await admin_events(redis_client, fleet_name)
            assert sorted(e.dataset for e in events if isinstance(e, Committed)) == names
        finally:
            go.set()
