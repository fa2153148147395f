"""A work task fenced while work is queued leaks no worker-wide in-flight slot.

Found from outside: when a work task ended with Fenced, its ``finally`` freed
its slot; the dispatcher took that slot at once and created a new task; the
shard's task group then aborted and cancelled that task before its first
step, so its ``finally`` never ran and the slot (``ctx.inflight``, shared by
the whole worker) was gone for good: after as many fences as slots, the worker
kept its shards and never started any work again. Slots are now freed by the
task's done-callback (``SchedulingMixin._work_done``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio

from shared.fleet import FleetRegistry
from shared.queue import Keys
from tests._support.checkpoints import HoldAt
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import committed
from tests._support.fleet_jobs import good_job
from tests._support.wait import wait_for

SLOTS = 2


async def test_fenced_work_does_not_leak_inflight_slots(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=1, worker={"max_inflight_datasets": SLOTS}
    )
    gate = HoldAt("commit.locked")
    reg = FleetRegistry(redis_client, Keys(fleet_name))
    async with inprocess_fleet(redis_client, settings, probe=gate) as fleet:
        store = fleet.store
        worker = fleet.worker
        try:
            pub = fleet.publisher
            names = [f"a-{i}" for i in range(10)]
            await pub.publish_many(await good_job(store, "job-a", names, 1, duplicate_attempt=False))

            async def slots_held() -> bool:
                return gate.waiting == SLOTS

            await wait_for(slots_held, timeout=30, what="both slots held by paused commits")
            runner, _t = worker._runners[0]
            ctx = runner.ctx
            assert len(runner.scheduler.queue) == len(names) - SLOTS
            # The coordinator would give the token back to w1 on its next tick (see stop_coordinator).
            await fleet.stop_coordinator()
            # Another owner took the shard (as after a freeze past the lease): steal the token.
            good_token = await reg.owner_token(0)
            await redis_client.set(Keys(fleet_name).shard_state(0, "owner"), b"other@999")
            gate.open.set()  # the paused commits go on, and their status saves are fenced

            async def runner_ended() -> bool:
                return _t.done()

            await wait_for(runner_ended, timeout=30, what="fenced runner ended")
            # Give the shard back to w1 (as the coordinator would, after the other owner left).
            await redis_client.set(Keys(fleet_name).shard_state(0, "owner"), good_token)
            await wait_for(
                lambda: committed(store, names, "job-a"), timeout=60, what="job-a committed by the new runner"
            )

            async def idle() -> bool:
                r = worker._runners.get(0)
                return r is not None and not r[0].scheduler.running and len(r[0].scheduler.queue) == 0

            await wait_for(idle, timeout=30, what="runner idle")
            assert ctx.inflight._value == SLOTS, f"leaked {SLOTS - ctx.inflight._value} in-flight slot(s)"
        finally:
            gate.open.set()


async def test_the_worker_still_commits_after_as_many_fences_as_slots(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    """Each fence of a work task with work queued used to leak one slot; after SLOTS of them the
    worker kept its shard (heartbeat fine) but never started any work again: a later job never committed."""
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=1, worker={"max_inflight_datasets": SLOTS}
    )
    gate = HoldAt("commit.locked")
    reg = FleetRegistry(redis_client, Keys(fleet_name))
    owner_key = Keys(fleet_name).shard_state(0, "owner")
    async with inprocess_fleet(redis_client, settings, probe=gate) as fleet:
        store = fleet.store
        worker = fleet.worker
        try:
            pub = fleet.publisher

            async def started() -> bool:
                return worker._runners.get(0) is not None

            await wait_for(started, timeout=30, what="shard 0 started")
            # The coordinator would give the token back to w1 on its next tick (see stop_coordinator).
            await fleet.stop_coordinator()
            for rnd in range(SLOTS):
                gate.open.clear()
                names = [f"r{rnd}-{i}" for i in range(10)]
                await pub.publish_many(await good_job(store, f"job-{rnd}", names, 1, duplicate_attempt=False))

                async def some_held() -> bool:
                    r = worker._runners.get(0)
                    return r is not None and gate.waiting >= 1 and len(r[0].scheduler.queue) > 0

                await wait_for(some_held, timeout=30, what=f"round {rnd}: commits paused, work queued")
                runner, task = worker._runners[0]
                ctx = runner.ctx
                good_token = await reg.owner_token(0)
                await redis_client.set(owner_key, b"other@999")
                gate.open.set()

                async def ended(task: asyncio.Task[None] = task) -> bool:
                    return task.done()

                await wait_for(ended, timeout=30, what="fenced runner ended")
                await redis_client.set(owner_key, good_token)
                assert ctx.inflight._value <= SLOTS
            names = ["late-0", "late-1"]
            await pub.publish_many(await good_job(store, "job-late", names, 1, duplicate_attempt=False))
            await wait_for(lambda: committed(store, names, "job-late"), timeout=60, what="job-late committed")
        finally:
            gate.open.set()
