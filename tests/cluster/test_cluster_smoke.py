"""The quick Redis Cluster check of the default run: a real 3+3 cluster, coordinator and worker in-process.

Publishes a small job through the cluster URL and waits for its commits and
admin events: every fleet-wide transaction, MGET and script ran on a
cluster (a cross-slot one fails there, it does not on one node).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from coordinator.admin import get_status
from shared import ConfigError, RetryPolicy, Settings, TransientError, load_settings
from shared.events import Committed, JobStarted, WorkerJoined
from shared.queue import (
    AdminPublisher,
    AsyncPublisher,
    Keys,
    SyncPublisher,
    connect,
    connect_sync,
    ensure_fleet,
    make_durable,
)
from shared.settings import Durability, RedisSettings
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, clean_audit, committed, no_wal_left
from tests._support.fleet_jobs import good_job
from tests._support.ports import free_port
from tests._support.repeated_fields import check_repeated, seed_repeated
from tests._support.wait import wait_for


def cluster_settings(url: str, root: Path, fleet: str) -> Settings:
    return fleet_settings(url, root, fleet, shards=4)


async def test_publish_and_commit_through_a_cluster(
    redis_cluster_url: str, fleet_name: str, tmp_path: Path
) -> None:
    settings = cluster_settings(redis_cluster_url, tmp_path / "store", fleet_name)
    client = connect(settings.redis)
    try:
        async with inprocess_fleet(client, settings, ensure=False) as fleet:
            store = fleet.store
            await ensure_fleet(client, fleet_name, settings.fleet.shards)
            pub = AsyncPublisher(client, fleet_name, settings.fleet.shards)
            datasets = [f"ds{i}" for i in range(4)]
            await pub.publish_many(await good_job(store, "job-ok", datasets, tasks=2))
            await wait_for(lambda: committed(store, datasets, "job-ok"), timeout=30, what="commits")

            async def four_committed() -> bool:
                evs = await admin_events(client, fleet_name)
                return sum(isinstance(e, Committed) for e in evs) == 4

            await wait_for(four_committed, timeout=20, what="4 committed events")
            await wait_for(lambda: no_wal_left(store), timeout=20, what="commit sequences finished")
            report = await clean_audit(store)
            assert report.ok, report.violations
            evs = await admin_events(client, fleet_name)
            assert any(isinstance(e, WorkerJoined) and e.worker == "w1" for e in evs)
            status = await get_status(settings)  # the CLI's status, through the cluster
            assert status["fleet"] == fleet_name, status
            # The shards' counts, kept by the save script on the cluster: the job ended everywhere.
            assert status["totals"]["open_jobs"] == 0 and status["totals"]["datasets"] == 0, status["totals"]
            assert all(sum(r["statuses"].values()) == 0 for r in status["shard_table"]), status["shard_table"]
            # An open job is counted while it is open.
            await pub.publish(
                JobStarted(job="job-open", datasets=datasets, timeout_s=600, started_at=time.time())
            )

            async def counted() -> bool:
                totals = (await get_status(settings))["totals"]
                return (totals["open_jobs"], totals["datasets"]) == (1, 4)

            await wait_for(counted, timeout=20, what="the open job counted")
        assert await client.scard(Keys(fleet_name).workers) == 0
    finally:
        await client.aclose()


@pytest.mark.redis_cluster
async def test_repeated_field_names_are_dead_lettered_on_a_cluster(
    redis_cluster_url: str, fleet_name: str, tmp_path: Path
) -> None:
    """tests/fleet/test_repeated_fields.py on the cluster, where a save reads ahead through
    redis-py's cluster pipeline (not a raw connection) and replies are parsed per node."""
    settings = fleet_settings(
        redis_cluster_url,
        tmp_path / "store",
        fleet_name,
        shards=4,
        security={"hmac_secret": "repeat-secret"},
        worker={"read_batch": 3},
    )
    client = connect(settings.redis)
    try:
        seeded = await seed_repeated(client, settings, shard=1, worker="w1")
        async with inprocess_fleet(client, settings, ensure=False) as fleet:
            await check_repeated(fleet, seeded)
    finally:
        await client.aclose()


async def test_publishers_wait_for_replicas_on_the_cluster(redis_cluster_url: str, fleet_name: str) -> None:
    settings = load_settings(env={}, overrides={"redis": {"url": redis_cluster_url, "wait_replicas": 1}})
    client = connect(settings.redis)
    policy = RetryPolicy(attempts=2).no_wait()
    try:
        await ensure_fleet(client, fleet_name, 16)
        evs = [JobStarted(job=f"j{i}", datasets=[f"d{i}"], timeout_s=60, started_at=1.0) for i in range(40)]
        pub = AsyncPublisher(client, fleet_name, 16, wait_replicas=1, policy=policy)
        ids = await pub.publish_many(evs)  # 16 shards over 3 masters: one WAIT per master, each acked
        assert len(ids) == 40
        sync = SyncPublisher(connect_sync(settings.redis), fleet_name, 16, wait_replicas=1, policy=policy)
        try:
            assert len(await asyncio.to_thread(sync.publish_many, evs)) == 40
            # Each master has one replica: asking for two can never be satisfied.
            sync.durability = Durability("replicas", 2, 1.0)
            with pytest.raises(TransientError, match="only 1 of 2 replicas"):
                await asyncio.to_thread(sync.publish, evs[0])
        finally:
            sync.close()
        admin = AdminPublisher(client, Keys(fleet_name), wait_replicas=1, policy=policy)
        await admin.publish(WorkerJoined(at=1.0, worker="w"))
        await make_durable(client, Keys(fleet_name).shard_state(3, "wait"), Durability("replicas", 1, 1.0))
        with pytest.raises(TransientError, match="only 1 of 2"):
            await make_durable(
                client, Keys(fleet_name).shard_state(3, "wait"), Durability("replicas", 2, 0.1)
            )
    finally:
        await client.aclose()


async def test_a_server_without_replicas_fails_wait_as_transient(redis_url: str, fleet_name: str) -> None:
    # A publisher's first publish checks the level (a ConfigError, see tests/integration/
    # test_durability.py); a wait that falls short after that is transient.
    client = connect(RedisSettings(url=redis_url))
    try:
        with pytest.raises(TransientError, match="only 0 of 1 replicas"):
            await make_durable(
                client, Keys(fleet_name).shard_state(0, "wait"), Durability("replicas", 1, 0.05)
            )
    finally:
        await client.aclose()


def test_a_cluster_url_on_a_plain_server_is_a_config_error(redis_url: str) -> None:
    port = redis_url.split(":")[-1].split("/")[0]
    with pytest.raises(ConfigError, match="not one"):
        connect_sync(RedisSettings(url=f"redis+cluster://127.0.0.1:{port}"))


def test_an_unreachable_cluster_is_transient() -> None:
    with pytest.raises(TransientError, match="cluster"):
        connect_sync(RedisSettings(url=f"redis+cluster://127.0.0.1:{free_port()}", socket_timeout=0.5))
