"""One worker id, one live process: a second process given a live worker's id does not join.

Two live processes under one id would share its owner tokens, which then fence
neither: both would run the same shards and overwrite each other's job state
(found from outside: datasets left waiting with every task recorded).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import msgspec
import pytest

from shared.commit import read_manifest
from shared.fleet import FleetRegistry, worker_info
from shared.queue import Keys
from tests._support.process_fleet import Fleet
from tests._support.wait import wait_for


async def _lease_instance(fleet: Fleet, worker: str) -> str | None:
    raw = await fleet.redis.get(fleet.keys.fleet_key(f"worker.{worker}"))
    if raw is None:
        return None
    return str(json.loads(raw).get("instance", ""))


async def test_the_registry_refuses_a_live_id_to_another_instance(fleet: Fleet) -> None:
    registry = FleetRegistry(fleet.redis, Keys(fleet.settings.fleet.name))
    first = worker_info("w1", 1.0, "pid1-aaaa")
    assert await registry.register(first, 30) is None
    other = worker_info("w1", 2.0, "pid2-bbbb")
    holder = await registry.register(other, 30)
    assert holder is not None and holder.instance == "pid1-aaaa"
    assert await _lease_instance(fleet, "w1") == "pid1-aaaa"  # nothing written
    assert not await registry.renew(other, 30)  # nor by a renewal
    assert await registry.renew(first, 30)
    # An instance known to be dead may be replaced before its lease runs out.
    assert await registry.register(other, 30, replacing="pid1-aaaa") is None
    assert await _lease_instance(fleet, "w1") == "pid2-bbbb"
    assert not await registry.renew(first, 30)  # the replaced one can no longer renew
    # Registrations that tell no instance (older workers) are not refused.
    assert await registry.register(worker_info("w1", 3.0), 30) is None
    # A live holder whose lease this version cannot read in full still holds the id.
    key = fleet.keys.fleet_key("worker.w2")
    await fleet.redis.set(key, json.dumps({"instance": "pid9-cccc"}), px=30_000)
    odd = await registry.register(worker_info("w2", 4.0, "pid4-dddd"), 30)
    assert odd is not None and odd.pid == 0
    assert await _lease_instance(fleet, "w2") == "pid9-cccc"  # nothing written


async def test_a_second_process_with_a_live_workers_id_stops_with_one_line(fleet: Fleet) -> None:
    first = fleet.start("worker", "w1")
    await wait_for(lambda: _lease_instance(fleet, "w1"), timeout=60, what="w1 registered")
    held = await _lease_instance(fleet, "w1")
    second = fleet.start("worker", "w1")  # same id, while the first runs
    started = time.monotonic()
    rc = await asyncio.to_thread(second.proc.wait, 60)
    lease = fleet.settings.worker.lease
    assert rc == 2
    assert time.monotonic() - started >= 1.5 * lease - 0.5  # it waited for the lease to expire first
    log = second.log_path.read_text()
    assert "is in use by a live worker" in log and "give each worker process its own --id" in log
    assert first.proc.poll() is None
    assert await _lease_instance(fleet, "w1") == held  # the first keeps its id


# A lease far longer than a process takes to start: "at once" is then told apart from "expired".
@pytest.mark.parametrize("fleet_overrides", [{"worker": {"lease": 20.0, "heartbeat": 2.0}}])
async def test_a_restarted_worker_takes_over_the_lease_of_its_dead_predecessor_at_once(fleet: Fleet) -> None:
    first = fleet.start("worker", "w1")
    await wait_for(lambda: _lease_instance(fleet, "w1"), timeout=60, what="w1 registered")
    held = await _lease_instance(fleet, "w1")
    first.signal(signal.SIGKILL)
    await asyncio.to_thread(first.proc.wait, 30)
    fleet.start("worker", "w1")  # restarted on this host before the old lease ran out

    async def replaced() -> bool:
        return await _lease_instance(fleet, "w1") not in (None, held)

    started = time.monotonic()
    await wait_for(replaced, timeout=60, what="the restarted worker registered")
    # At once: well inside the old lease (renewed by nobody, but not expired yet).
    assert time.monotonic() - started < fleet.settings.worker.lease * 0.75


async def test_a_worker_whose_id_was_taken_while_it_was_frozen_stops(fleet: Fleet) -> None:
    from shared.fleet import EXIT_CRASHED

    first = fleet.start("worker", "w1")
    await wait_for(lambda: _lease_instance(fleet, "w1"), timeout=60, what="w1 registered")
    held = await _lease_instance(fleet, "w1")
    first.signal(signal.SIGSTOP)  # frozen: its lease runs out, and the id is free again

    async def expired() -> bool:
        return await _lease_instance(fleet, "w1") is None

    await wait_for(expired, timeout=30, what="the frozen worker's lease expired")
    fleet.start("worker", "w1")

    async def taken() -> bool:
        return await _lease_instance(fleet, "w1") not in (None, held)

    await wait_for(taken, timeout=60, what="the new process registered")
    first.signal(signal.SIGCONT)
    rc = await asyncio.to_thread(first.proc.wait, 60)
    assert rc == EXIT_CRASHED
    assert "was taken by another process" in first.log_path.read_text()


async def test_a_dataset_left_waiting_with_every_task_in_is_committed_at_the_next_start(fleet: Fleet) -> None:
    # The state two processes under one id could leave: the job finished (the
    # dataset waits for its tasks), every task is recorded, and no commit was decided.
    from shared.events import DatasetExpectation, JobFinished
    from shared.queue import shard_of
    from tests._support.fleet_jobs import good_job
    from workers._core import DatasetState

    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns every shard")
    events = await good_job(fleet.store, "job1", ["ds1"], 3, duplicate_attempt=False)
    *tasks, finished = events
    assert isinstance(finished, JobFinished)
    await fleet.publisher.publish_many(tasks)  # every task in; the job not finished yet
    shard = shard_of("ds1", fleet.settings.fleet.shards)
    jobs_key = fleet.keys.shard_state(shard, "jobs")
    attempts_key = fleet.keys.shard_state(shard, "attempts")

    async def recorded() -> bool:
        return await fleet.redis.hlen(attempts_key) == 3 and await fleet.redis.hexists(jobs_key, "job1")

    await wait_for(recorded, timeout=60, what="the three attempts recorded")
    assert fleet.names["w1"].terminate() == 0
    datasets_key = fleet.keys.shard_state(shard, "datasets")  # each dataset's own record (state v2)
    ds = msgspec.json.decode(await fleet.redis.hget(datasets_key, "job1/ds1"), type=DatasetState)
    stuck = msgspec.structs.replace(ds, status="waiting", expected=DatasetExpectation(tasks=3))
    await fleet.redis.hset(datasets_key, "job1/ds1", msgspec.json.encode(stuck))
    fleet.start("worker", "w1")

    async def committed() -> bool:
        return await read_manifest(fleet.store, "ds1", "job1") is not None

    await wait_for(committed, timeout=60, what="the stuck dataset committed")
