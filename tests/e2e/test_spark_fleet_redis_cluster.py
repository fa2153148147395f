"""The Spark end-to-end test publishing through a Redis Cluster: ``pytest -m redis_cluster``.

tests/e2e/test_spark_fleet.py's module fleet (a coordinator and two worker
processes) and its exactly-once job test, with the fleet, the Spark driver
and the executors' sync publisher all on a local 3-master + 3-replica
cluster (``redis+cluster://`` URL).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio

from shared.queue import connect, connect_sync, ensure_fleet_sync
from shared.settings import RedisSettings
from shared.spark import ProducerConfig
from tests._support.processes import FleetProcess, fleet_processes, write_config
from tests._support.redis_cluster import LocalRedisCluster
from tests.fleet._helpers import fleet_settings

from .test_spark_fleet import SECRET, SHARDS, WORKERS, E2EFleet, fleet, spark, store
from .test_spark_fleet import (
    test_three_datasets_commit_exactly_once_with_a_retried_winner_and_watermarks as test_spark_job_on_cluster,
)

pytestmark = [pytest.mark.spark, pytest.mark.redis_cluster]

__all__ = ["fleet", "spark", "store", "test_spark_job_on_cluster"]


@pytest.fixture(scope="module")
def e2e(redis_cluster: LocalRedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EFleet]:
    """The e2e fleet of test_spark_fleet.py, on the cluster."""
    base = tmp_path_factory.mktemp("e2e-fleet-cluster")
    (base / "store").mkdir()
    logs = base / "logs"
    logs.mkdir()
    settings = fleet_settings(
        redis_cluster.url,
        base / "store",
        "e2e" + secrets.token_hex(4),
        shards=SHARDS,
        security={"hmac_secret": SECRET},
        queue={"trim_interval": 0.0},
        redis={"wait_replicas": 1},
    )
    config = write_config(settings, base / "fleet.toml")
    client = connect_sync(settings.redis)
    try:
        ensure_fleet_sync(client, settings.fleet.name, SHARDS)
    finally:
        client.close()
    producer = ProducerConfig.from_settings(settings, job_timeout=120.0, app="e2e-cluster")
    assert producer.redis_url.startswith("redis+cluster://") and producer.redis_wait_replicas == 1
    with fleet_processes(logs) as procs:
        procs.append(FleetProcess("coordinator", "c1", config, logs))
        procs.extend(FleetProcess("worker", w, config, logs) for w in sorted(WORKERS))
        yield E2EFleet(settings, producer, procs)


@pytest.fixture
async def r(e2e: E2EFleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = connect(RedisSettings(url=e2e.settings.redis.url))
    try:
        yield client
    finally:
        await client.aclose()
