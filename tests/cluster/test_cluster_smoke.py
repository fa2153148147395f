"""The quick Redis Cluster check of the default run: a real 3+3 cluster, coordinator and worker in-process.

Publishes a small job through the cluster URL and waits for its commits and
admin events: every fleet-wide transaction, MGET and script ran on a
cluster (a cross-slot one fails there, it does not on one node).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from coordinator import Coordinator
from shared import Settings
from shared.events import Committed, WorkerJoined
from shared.queue import AsyncPublisher, Keys, connect, ensure_fleet
from shared.storage import open_store
from tests._support.wait import wait_for
from tests.fleet._helpers import admin_events, clean_audit, committed, fleet_settings, good_job, no_wal_left
from workers import Worker


def cluster_settings(url: str, root: Path, fleet: str) -> Settings:
    return fleet_settings(url, root, fleet, shards=4)


async def test_publish_and_commit_through_a_cluster(
    redis_cluster_url: str, fleet_name: str, tmp_path: Path
) -> None:
    settings = cluster_settings(redis_cluster_url, tmp_path / "store", fleet_name)
    client = connect(settings.redis)
    coord = Coordinator(settings, coordinator_id="c1")
    worker = Worker(settings, worker_id="w1")
    try:
        async with open_store(settings.store.url, settings.store) as store, asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(x.run()) for x in (coord, worker)]
            try:
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
            finally:
                worker.shutdown()
                coord.shutdown()
            await asyncio.gather(*tasks)
        assert await client.scard(Keys(fleet_name).workers) == 0
    finally:
        await client.aclose()
