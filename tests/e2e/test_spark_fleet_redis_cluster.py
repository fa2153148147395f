"""The Spark end-to-end test publishing through a Redis Cluster: ``pytest -m redis_cluster``.

tests/e2e/test_spark_fleet.py's module fleet (a coordinator and two worker
processes) and its exactly-once job test, with the fleet, the Spark driver
and the executors' sync publisher all on a local 3-master + 3-replica
cluster (``redis+cluster://`` URL).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio

from shared.queue import connect
from shared.settings import RedisSettings
from shared.storage import ObjectStore
from tests._support.redis_cluster import LocalRedisCluster
from tests._support.spark import spark_session_fixture
from tests._support.spark_fleet import (  # noqa: F401 - the store and fleet fixtures
    E2EFleet,
    e2e_store,
    run_e2e_fleet,
    settled_fleet,
    three_datasets_commit_exactly_once,
)

pytestmark = [pytest.mark.spark, pytest.mark.redis_cluster]

spark = spark_session_fixture("test-e2e-spark-fleet", master="local[2,2]")


@pytest.fixture(scope="module")
def e2e(redis_cluster: LocalRedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EFleet]:
    """The e2e fleet of test_spark_fleet.py, on the cluster."""
    base = tmp_path_factory.mktemp("e2e-fleet-cluster")
    with run_e2e_fleet(base, redis_cluster.url, app="e2e-cluster", redis={"wait_replicas": 1}) as fleet:
        producer = fleet.producer
        assert producer.redis_url.startswith("redis+cluster://") and producer.redis_wait_replicas == 1
        yield fleet


@pytest.fixture
async def r(e2e: E2EFleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = connect(RedisSettings(url=e2e.settings.redis.url))
    try:
        yield client
    finally:
        await client.aclose()


async def test_spark_job_on_cluster(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    """test_spark_fleet.py's exactly-once job, through the cluster."""
    await three_datasets_commit_exactly_once(spark, fleet, r, store)
