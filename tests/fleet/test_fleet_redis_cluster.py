"""The multi-process fleet on a real Redis Cluster (3 masters + 3 replicas): ``pytest -m redis_cluster``.

The same fleet fixture as tests/fleet/test_fleet_processes.py, with its
``redis_url`` / ``redis_client`` pointed at a local cluster: the 3-worker,
200-dataset run with a failed and a cancelled job must pass unchanged, and a
master SIGKILLed mid-run (its replica promoted by the cluster) must lose and
double nothing with ``redis.wait_replicas = 1``, the fleet carrying on
without a restart.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from shared import RetryPolicy
from shared.events import Aborted, Committed, WorkerJoined
from shared.queue import AsyncPublisher, Keys, connect, shard_of
from shared.settings import RedisSettings
from tests._support.fleet_checks import admin_events, committed, no_staging_left
from tests._support.fleet_jobs import failed_job, good_job
from tests._support.process_fleet import (
    Fleet,
    assert_exactly_once,
    cancelled_job,
    report,
    three_workers_200_datasets,
)
from tests._support.redis_cluster import LocalRedisCluster
from tests._support.wait import wait_for

pytestmark = pytest.mark.redis_cluster


@pytest.fixture
def redis_url(redis_cluster_url: str) -> str:
    """The fleet fixture's Redis: the cluster."""
    return redis_cluster_url


@pytest.fixture
async def redis_client(redis_cluster_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A cluster client for the test's own reads and publishes."""
    client = connect(RedisSettings(url=redis_cluster_url))
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fleet_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    """WAIT for one replica in the failover test (every master has one)."""
    if request.node.name.startswith("test_master_killed"):
        # A failover takes ~2-4 s here (cluster-node-timeout 1.5 s): retries must outlast it.
        retry = {"attempts": 30, "initial": 0.05, "maximum": 0.5, "budget": 30.0}
        return {"redis": {"wait_replicas": 1, "wait_timeout": 2.0}, "commit": {"retry": retry}}
    return {}


async def test_master_killed_mid_run_loses_and_doubles_nothing_with_wait(
    fleet: Fleet, redis_cluster: LocalRedisCluster
) -> None:
    fleet.start("coordinator", "c1")
    for i in (1, 2, 3):
        fleet.start("worker", f"w{i}")
    await wait_for(
        lambda: fleet.owners_settled({"w1", "w2", "w3"}), timeout=60, what="3 workers own all shards"
    )
    publisher = AsyncPublisher(
        fleet.redis,
        fleet.settings.fleet.name,
        fleet.settings.fleet.shards,
        wait_replicas=1,
        wait_timeout=2.0,
        policy=RetryPolicy(attempts=40, initial=0.05, maximum=0.5, budget=40.0),
    )
    datasets = [f"ds{i:03d}" for i in range(120)]
    first, second = datasets[:60], datasets[60:]
    bad = await failed_job(fleet.store, "bad", datasets[:10], tasks=2)
    await publisher.publish_many([*await good_job(fleet.store, "one", first, tasks=4), *bad])
    await wait_for(lambda: committed(fleet.store, first[:5], "one"), timeout=60, what="first commits")
    # Kill the master holding the fleet slot (membership, assignment, admin stream) or,
    # if it also serves a shard stream, all the better: both kinds of keys fail over.
    keys = Keys(fleet.settings.fleet.name)
    killed = redis_cluster.kill_master_of(keys.admin)
    shard_streams = {keys.events(shard_of(ds, fleet.settings.fleet.shards)) for ds in datasets}
    on_killed = [k for k in shard_streams if redis_cluster.master_port_of(k) == killed.port]
    started = time.monotonic()
    # Published while the failover is under way: retried until the replica is promoted and,
    # WAIT needing one replica, until the killed node is back (as the new master's replica).
    cancel = await cancelled_job(fleet, "cancel", datasets[10:20], tasks=2)
    two = await good_job(fleet.store, "two", second, tasks=4)
    async with asyncio.TaskGroup() as tg:
        publishing = tg.create_task(publisher.publish_many([*two, *cancel]))
        await asyncio.to_thread(redis_cluster.wait_failover, keys.admin, killed, 30)
        promoted = time.monotonic() - started
        await asyncio.to_thread(killed.start)  # its nodes.conf makes it rejoin as a replica
        await asyncio.to_thread(redis_cluster.wait_ok, 30)
        rejoined = time.monotonic() - started
    publishing.result()
    report(
        f"master :{killed.port} killed: replica promoted after {promoted:.1f}s, old master back as a "
        f"replica after {rejoined:.1f}s, publish done after {time.monotonic() - started:.1f}s"
    )
    await wait_for(lambda: committed(fleet.store, first, "one"), timeout=180, interval=0.5, what="job one")
    await wait_for(lambda: committed(fleet.store, second, "two"), timeout=180, interval=0.5, what="job two")
    for job in ("one", "two", "bad", "cancel"):
        try:
            await wait_for(
                lambda job=job: no_staging_left(fleet.store, job), timeout=60, what=f"{job} staging gone"
            )
        except AssertionError:
            left = [o.key async for o in fleet.store.list(f"_staging/{job}/")]
            evs = [
                e
                for e in await admin_events(fleet.redis, fleet.settings.fleet.name)
                if getattr(e, "job", "") == job
            ]
            raise AssertionError(f"{job} staging left: {left[:20]}; its admin events: {evs}") from None

    aborted: Counter[tuple[str, str]] = Counter()
    want = Counter({(ds, "bad"): 1 for ds in datasets[:10]} | {(ds, "cancel"): 1 for ds in datasets[10:20]})

    async def aborts_done() -> bool:
        evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
        aborted.clear()
        aborted.update((e.dataset, e.job) for e in evs if isinstance(e, Aborted))
        return aborted == want

    try:
        await wait_for(aborts_done, timeout=60, what="20 aborted events, once each")
    except AssertionError:
        raise AssertionError(
            f"aborted events: missing {sorted(want - aborted)}, extra {sorted(aborted - want)}"
        ) from None
    expected = {(ds, "one") for ds in first} | {(ds, "two") for ds in second}
    await assert_exactly_once(fleet, expected)
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert sum(isinstance(e, Committed) for e in evs) == len(expected)
    assert {e.worker for e in evs if isinstance(e, WorkerJoined)} >= {"w1", "w2", "w3"}
    # Leases lapse while the fleet slot fails over: every worker must be back as an owner
    # (a worker re-registering as the coordinator forgot it used to be left out for good).
    await wait_for(
        lambda: fleet.owners_settled({"w1", "w2", "w3"}), timeout=60, what="3 workers own all shards again"
    )
    for p in fleet.procs:
        assert p.proc.poll() is None, f"{p.name} exited after the failover"
    report(f"{len(on_killed)} of {len(shard_streams)} shard streams were on the killed master")


async def test_three_workers_200_datasets_on_cluster(fleet: Fleet) -> None:
    """test_fleet_processes.py's 200-dataset run, through the cluster."""
    await three_workers_200_datasets(fleet)
