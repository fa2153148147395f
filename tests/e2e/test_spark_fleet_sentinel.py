"""A Spark job across a Sentinel failover: ``pytest -m ha`` (``make redis-ha``).

tests/e2e/test_spark_fleet.py's module fleet (a coordinator and two worker
processes) on a master + 2 replicas + 3 Sentinels, every client (the fleet,
the Spark driver and its heartbeat, the executors' sync publisher) through
the ``redis+sentinel://`` URL, ``redis.durability = "replicas"`` (``WAIT 1``). The job writes one
dataset, then the master is SIGKILLed and a second dataset is written while
the Sentinels promote a replica (its tasks publish during the failover);
``commit_job`` publishes ``JobFinished`` and waits for the outcome, and must
return with both datasets committed, each exactly once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import pytest
import redis.asyncio

from shared.commit import audit, read_manifest
from shared.events import Committed, manifest_key
from shared.queue import connect
from shared.settings import RedisSettings
from shared.spark import commit_job
from shared.storage import ObjectStore
from tests._support.fleet_checks import admin_events
from tests._support.redis_sentinel import LocalSentinelGroup
from tests._support.spark import spark_session_fixture
from tests._support.spark_fleet import (  # noqa: F401 - the store and fleet fixtures
    E2EFleet,
    e2e_store,
    keys_under,
    run_e2e_fleet,
    settled_fleet,
)

pytestmark = [pytest.mark.spark, pytest.mark.ha]

spark = spark_session_fixture("test-e2e-spark-sentinel", master="local[2,2]")

SOCKET_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinelGroup]:
    g = LocalSentinelGroup(tmp_path_factory.mktemp("sentinel-spark"))
    try:
        g.start()
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def e2e(group: LocalSentinelGroup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EFleet]:
    """The e2e fleet of test_spark_fleet.py, through the Sentinels, WAITing for one replica."""
    retry = {"attempts": 30, "initial": 0.05, "maximum": 0.5, "budget": 30.0}
    with run_e2e_fleet(
        tmp_path_factory.mktemp("e2e-fleet-sentinel"),
        group.url,
        app="e2e-sentinel",
        redis={"durability": "replicas", "wait_timeout": 2.0, "socket_timeout": SOCKET_TIMEOUT},
        commit={"retry": retry},
    ) as fleet:
        assert fleet.producer.redis_url.startswith("redis+sentinel://")
        assert fleet.producer.redis_durability == "replicas"
        assert fleet.producer.redis_settings.durable.replicas == 1
        yield fleet


@pytest.fixture
async def r(e2e: E2EFleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = connect(RedisSettings(url=e2e.settings.redis.url, socket_timeout=SOCKET_TIMEOUT))
    try:
        yield client
    finally:
        await client.aclose()


def slow_rows(spark: Any, n: int, partitions: int, pause: float) -> Any:
    """Return ``n`` rows ``(id, name)`` made by tasks that each take ``pause`` seconds first."""

    def made(rows: Iterable[int]) -> Iterator[tuple[int, str]]:
        time.sleep(pause)  # a task that takes a while: the failover happens while tasks run
        for i in rows:
            yield (i, f"n{i}")

    rdd = spark.sparkContext.parallelize(range(n), partitions).mapPartitions(made)
    return spark.createDataFrame(rdd, "id long, name string")


async def test_a_spark_job_across_a_master_kill_commits_each_dataset_once(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore, group: LocalSentinelGroup
) -> None:
    names = ["before", "during"]
    started = time.monotonic()
    with commit_job(spark, datasets=names, config=fleet.producer) as job:
        job.write_dataset(spark.range(0, 60, numPartitions=2), "before")
        killed = group.kill_master()
        killed_at = time.monotonic()
        # Four tasks of ~1.5 s on two slots: they publish while the Sentinels promote a replica.
        won = job.write_dataset(slow_rows(spark, 80, 4, 1.5), "during")
        written = time.monotonic()
    done = time.monotonic()
    new = group.master()
    assert new.port != killed.port
    sys.stderr.write(
        f"[figure] spark job across a master kill: killed {killed_at - started:.1f}s in, second write done "
        f"{written - killed_at:.1f}s after the kill, commit_job returned {done - killed_at:.1f}s after it "
        f"(master :{killed.port} -> :{new.port}); winning attempts of the second write "
        f"{[w.attempt for w in won]}\n"
    )

    # commit_job returned: the fleet's result for each dataset is "committed".
    assert {ds: res.status for ds, res in job.results.items()} == {
        "before": "committed",
        "during": "committed",
    }
    job_id = job.job_id
    for ds in names:
        manifest = await read_manifest(store, ds, job_id)
        assert manifest is not None and manifest.files
        assert job.results[ds].manifest == manifest_key(ds, job_id)
        assert await keys_under(store, f"{ds}/_commits/") == [manifest_key(ds, job_id)]
    assert await keys_under(store, f"_staging/{job_id}/") == []
    admin = await admin_events(r, fleet.settings.fleet.name)
    commits = sorted(e.dataset for e in admin if isinstance(e, Committed) and e.job == job_id)
    assert commits == names, commits
    report = await audit(store, ended_jobs=[job_id])
    assert report.ok, report.violations
