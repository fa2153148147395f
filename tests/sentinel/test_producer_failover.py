"""The Spark producer's publish rides through a Sentinel failover on its retry budget: ``make redis-ha``.

A master, two replicas and three Sentinels whose ``down-after-milliseconds`` is
10 s: longer than the publisher's own default policy lasts (about 5 s), as
Sentinel's default (30 s) is, and short enough for a test. The master is
SIGKILLed; a publish with ``redis_retry_budget = 3`` fails (a TransientError:
no master for 10 s), and one with the default budget (60 s) returns once the
Sentinels have promoted a replica, its entry on the new master's stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from shared import TransientError
from shared.events import JobStarted
from shared.queue import Keys, SyncPublisher, shard_of
from shared.spark import ProducerConfig
from shared.spark._publishing import publish
from tests._support.process_fleet import report
from tests._support.redis_sentinel import LocalSentinelGroup

pytestmark = pytest.mark.ha

DOWN_AFTER_MS = 10_000
SHARDS = 4


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalSentinelGroup]:
    g = LocalSentinelGroup(tmp_path / "sentinel-slow", down_after_ms=DOWN_AFTER_MS)
    try:
        g.start()
        yield g
    finally:
        g.stop()


def started(job: str) -> JobStarted:
    return JobStarted(job=job, datasets=["orders"], timeout_s=60, started_at=time.time())


def test_a_publish_rides_through_a_master_kill_on_the_default_budget(
    group: LocalSentinelGroup, fleet_name: str
) -> None:
    config = ProducerConfig(
        redis_url=group.url,
        store_url="file:///nowhere",
        fleet=fleet_name,
        shards=SHARDS,
        redis_socket_timeout=1.0,
        redis_durability="replicas",
    )
    assert config.redis_retry_budget == 60.0
    short = msgspec.structs.replace(config, redis_retry_budget=3.0)
    try:
        publish(config, started("before"))
        publish(short, started("before-short"))  # both publishers connected to the first master
        killed = group.kill_master()
        killed_at = time.monotonic()

        with pytest.raises(TransientError):
            publish(short, started("lost"))
        gave_up = time.monotonic() - killed_at
        assert gave_up < DOWN_AFTER_MS / 1000, gave_up

        publish(config, started("across"))
        took = time.monotonic() - killed_at
        new = group.master()
        assert new.port != killed.port
        assert took > DOWN_AFTER_MS / 1000, took  # it did wait for the Sentinels
        report(f"a publish across a master kill (down-after 10 s) returned {took:.1f}s after it")
    finally:
        SyncPublisher.close_cached()

    stream = Keys(fleet_name).events(shard_of("orders", SHARDS))
    client = group.node(new.port)
    try:
        jobs = [msgspec.json.decode(fields[b"data"])["job"] for _id, fields in client.xrange(stream)]
    finally:
        client.close()
    assert "across" in jobs and "lost" not in jobs, jobs
