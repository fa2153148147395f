"""Job order is commit order across a Sentinel failover and a Redis Cluster failover (issue 31 item 2).

The run of test_commit_order.py (30 jobs share 50 datasets, 3 bound to Iceberg tables and 3 to Delta
tables, two worker processes) with the fleet's Redis failing over while most commits are still queued:
the master SIGKILLed and a replica promoted, under ``redis.durability = "replicas"`` (every state save
and outcome waits for a replica: docs/queue.md "Durability"). Every commit must happen once, the audit
must be clean, and each dataset's commits and each table's snapshots/versions must be in the jobs'
``job_finished`` order. Not run by default:

- ``pytest -m ha tests/fleet/test_commit_order_failover.py -k sentinel`` (master + 2 replicas + 3 Sentinels);
- ``pytest -m redis_cluster tests/fleet/test_commit_order_failover.py -k cluster`` (3 masters + 3 replicas).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from shared import TransientError
from shared.queue import Keys, connect, shard_of
from shared.settings import RedisSettings
from tests._support.fleet_checks import admin_events
from tests._support.process_fleet import Fleet, report
from tests._support.redis_cluster import LocalRedisCluster
from tests._support.redis_sentinel import LocalSentinelGroup
from tests._support.table_order import commits_started_by, jobs_sharing_bound_datasets, order_bindings
from tests._support.wait import wait_for

JOBS = [f"order{j:02d}" for j in range(30)]
DATASETS = [f"shared{i:02d}" for i in range(50)]
SOCKET_TIMEOUT = 2.0
FAILOVER_TIMEOUT = 30.0


@pytest.fixture
def redis_url(request: pytest.FixtureRequest) -> str:
    """The fleet fixture's Redis: the Sentinel group or the cluster, as the test asks."""
    name = "redis_sentinel_url" if "sentinel" in request.node.name else "redis_cluster_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """The test's own client, through the Sentinels or the cluster."""
    client = connect(RedisSettings(url=redis_url, socket_timeout=SOCKET_TIMEOUT))
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    """WAIT for one replica; retries that outlast a failover (a few seconds here)."""
    retry = {"attempts": 30, "initial": 0.05, "maximum": 0.5, "budget": 30.0}
    return {
        "redis": {"durability": "replicas", "wait_timeout": 2.0, "socket_timeout": SOCKET_TIMEOUT},
        "commit": {"retry": retry},
    }


async def _reads_admin(fleet: Fleet) -> bool:
    """Return True once the test's own client reads the admin stream again after the failover."""
    try:
        await admin_events(fleet.redis, fleet.settings.fleet.name)
    except TransientError:  # a pooled connection to the killed node fails once, then it reconnects
        return False
    return True


@pytest.mark.ha
async def test_commit_order_is_the_job_order_across_a_sentinel_failover(
    fleet: Fleet, redis_sentinel: LocalSentinelGroup
) -> None:
    took_over: list[float] = []

    async def fail_over(fleet: Fleet) -> None:
        await wait_for(lambda: commits_started_by(fleet, "w1", 20), timeout=90, interval=0.01, what="w1")
        killed = redis_sentinel.kill_master()
        started = time.monotonic()
        await asyncio.to_thread(redis_sentinel.wait_failover, killed, FAILOVER_TIMEOUT)
        took_over.append(time.monotonic() - started)
        await wait_for(lambda: _reads_admin(fleet), timeout=FAILOVER_TIMEOUT, what="the test's client back")

    bindings = order_bindings(DATASETS, iceberg=3, delta=3)
    took = await jobs_sharing_bound_datasets(fleet, JOBS, DATASETS, bindings, fail_over)
    report(
        f"{len(JOBS)} jobs x {len(DATASETS)} shared datasets (6 bound) committed in {took:.1f}s across a "
        f"Sentinel failover (replica promoted {took_over[0]:.1f}s after the master's SIGKILL)"
    )


@pytest.mark.redis_cluster
async def test_commit_order_is_the_job_order_across_a_cluster_failover(
    fleet: Fleet, redis_cluster: LocalRedisCluster
) -> None:
    took_over: list[str] = []
    keys = Keys(fleet.settings.fleet.name)
    # The master of a shard's stream and state that holds some of the datasets (the first one's).
    key = keys.events(shard_of(DATASETS[0], fleet.settings.fleet.shards))

    async def fail_over(fleet: Fleet) -> None:
        await wait_for(lambda: commits_started_by(fleet, "w1", 20), timeout=90, interval=0.01, what="w1")
        killed = redis_cluster.kill_master_of(key)
        started = time.monotonic()
        await asyncio.to_thread(redis_cluster.wait_failover, key, killed, FAILOVER_TIMEOUT)
        promoted = time.monotonic() - started
        await asyncio.to_thread(killed.start)  # its nodes.conf makes it rejoin as the new master's replica
        await asyncio.to_thread(redis_cluster.wait_ok, FAILOVER_TIMEOUT)
        await wait_for(lambda: _reads_admin(fleet), timeout=FAILOVER_TIMEOUT, what="the test's client back")
        took_over.append(
            f"replica promoted {promoted:.1f}s, old master back {time.monotonic() - started:.1f}s"
        )

    bindings = order_bindings(DATASETS, iceberg=3, delta=3)
    took = await jobs_sharing_bound_datasets(fleet, JOBS, DATASETS, bindings, fail_over)
    report(
        f"{len(JOBS)} jobs x {len(DATASETS)} shared datasets (6 bound) committed in {took:.1f}s across a "
        f"cluster failover ({took_over[0]} after the SIGKILL)"
    )
