"""A shard whose state record in Redis cannot be read is set aside (admin event, marker,
no crash, no tight loop), the other shards keep committing, and the documented way out works."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio

from coordinator.admin import fleet_summary
from shared.events import ShardSetAside
from shared.queue import DEFAULT_GROUP
from tests._support.fleet import InProcessFleet, fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import good_job
from tests._support.routing import dataset_on
from tests._support.wait import wait_for

SHARDS = 8
BAD = 4


async def _aside_events(fleet: InProcessFleet) -> list[ShardSetAside]:
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    return [e for e in evs if isinstance(e, ShardSetAside)]


@pytest.mark.parametrize(
    ("hash_name", "field", "raw", "why"),
    [
        ("jobs", "j-bad", b'{"v":1,"job":"j-bad","opened_at":"yesterday"', "does not decode"),
        ("jobs", "j-new", b'{"v":3,"job":"j-new","opened_at":1,"deadline":2,"datasets":{}}', "version 3"),
        ("datasets", "j-new/x", b'{"v":3,"status":"open"}', "version 3"),
        ("attempts", "j/x/0/0", b"\xff\xfe not json", "does not decode"),
        ("ended", "j-old", b'{"v":9,"status":"committed","at":1}', "version 9"),
    ],
    ids=["garbage", "newer-job", "newer-dataset", "attempt", "ended-version"],
)
async def test_unreadable_shard_state_sets_the_shard_aside_until_the_operator_fixes_it(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    hash_name: str,
    field: str,
    raw: bytes,
    why: str,
) -> None:
    key = f"cf:{fleet_name}:{{s{BAD}}}:state:{hash_name}"
    await redis_client.hset(key, field, raw)
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name)
    ) as fleet:
        bad_ds, good_ds = dataset_on(BAD, SHARDS), dataset_on(BAD + 1, SHARDS)
        # The rest of the fleet goes on; the set-aside shard reads nothing meanwhile.
        await fleet.publisher.publish_many(await good_job(fleet.store, "during", [bad_ds, good_ds], tasks=2))
        await wait_for(
            lambda: committed(fleet.store, [good_ds], "during"), timeout=60, what="other shard commits"
        )
        (ev,) = await wait_for(lambda: _aside_events(fleet), timeout=30, what="shard_set_aside event")
        assert (ev.shard, ev.key, ev.field, ev.worker) == (BAD, key, field, "w1")
        assert why in ev.reason
        marker = f"cf:{fleet_name}:{{s{BAD}}}:state:aside"
        assert (await redis_client.hgetall(marker))[b"field"] == field.encode()
        assert not await committed(fleet.store, [bad_ds], "during")
        assert fleet.worker_alive() and BAD in fleet.worker.running_shards
        status = await fleet_summary(redis_client, fleet.keys, fleet.settings)
        aside = {r["shard"]: r["set_aside"] for r in status["shard_table"] if r["set_aside"]}
        assert set(aside) == {BAD} and aside[BAD]["field"] == field
        # Not retried in a tight loop: still exactly one announcement after a further commit.
        await fleet.publisher.publish_many(await good_job(fleet.store, "later", [good_ds], tasks=1))
        await wait_for(lambda: committed(fleet.store, [good_ds], "later"), timeout=60, what="second commit")
        assert len(await _aside_events(fleet)) == 1

        # The way out (docs/queue.md): delete the bad field, then the marker.
        await redis_client.hdel(key, field)
        await redis_client.delete(marker)
        await wait_for(lambda: committed(fleet.store, [bad_ds], "during"), timeout=60, what="shard back")
        assert not await redis_client.exists(marker)
        pending = await redis_client.xpending(fleet.keys.events(BAD), DEFAULT_GROUP)
        assert pending["pending"] == 0
        assert len(await _aside_events(fleet)) == 1


async def test_a_state_key_of_the_wrong_type_sets_the_shard_aside(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    key = f"cf:{fleet_name}:{{s{BAD}}}:state:ended"
    await redis_client.set(key, b"not a hash")
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name)
    ) as fleet:
        (ev,) = await wait_for(lambda: _aside_events(fleet), timeout=30, what="shard_set_aside event")
        assert (ev.shard, ev.key, ev.field) == (BAD, key, "") and "WRONGTYPE" in ev.reason
        bad_ds = dataset_on(BAD, SHARDS)
        await fleet.publisher.publish_many(await good_job(fleet.store, "wt", [bad_ds], tasks=1))
        await redis_client.delete(key, f"cf:{fleet_name}:{{s{BAD}}}:state:aside")  # the way out
        await wait_for(lambda: committed(fleet.store, [bad_ds], "wt"), timeout=60, what="shard back")
        assert fleet.worker_alive()


async def test_deleting_the_marker_without_a_fix_announces_again(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    key = f"cf:{fleet_name}:{{s{BAD}}}:state:jobs"
    marker = f"cf:{fleet_name}:{{s{BAD}}}:state:aside"
    await redis_client.hset(key, "j", b"[]")
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name)
    ) as fleet:
        await wait_for(lambda: _aside_events(fleet), timeout=30, what="first announcement")
        await redis_client.delete(marker)
        await wait_for(lambda: _count_is(_aside_events(fleet), 2), timeout=30, what="second announcement")
        assert await redis_client.exists(marker)
        assert fleet.worker_alive()


async def _count_is(evs, n: int) -> bool:  # type: ignore[no-untyped-def]
    return len(await evs) == n
