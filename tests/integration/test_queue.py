"""The Redis Streams layer against a real redis-server: publish, consume, pending, claim, dead letters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from coordinator.bench import raw_consume_rate
from shared import ConfigError, RetryPolicy
from shared.events import (
    DatasetExpectation,
    InvalidMessage,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
    ValidationLimits,
    decode_entry,
)
from shared.queue import (
    AsyncPublisher,
    Entry,
    Keys,
    ShardConsumer,
    connect,
    count_dead_letters,
    ensure_fleet,
    keep_repeated_fields,
    read_dead_letters,
    read_fleet_meta,
    shard_of,
    split_by_shard,
)
from shared.queue._entry import entries_from_reply
from shared.settings import RedisSettings
from tests._support.routing import datasets_on
from tests._support.wait import wait_for

SHARDS = 4
LIMITS = ValidationLimits()
FAST = RetryPolicy(attempts=3).no_wait()


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    c = connect(RedisSettings(url=redis_url, socket_timeout=5.0))
    try:
        yield c
    finally:
        await c.aclose()


def task(dataset: str, index: int, attempt: int = 0, job: str = "job-1") -> TaskFinished:
    return TaskFinished(
        job=job,
        dataset=dataset,
        task=index,
        attempt=attempt,
        files=[StagedFile(path=f"part-{index}.parquet", size=10 + index)],
        finished_at=1.0,
    )


async def consumer(client: redis.asyncio.Redis, fleet: str, shard: int, name: str) -> ShardConsumer:
    c = ShardConsumer(client, Keys(fleet), shard, consumer=name)
    await c.ensure_group()
    return c


async def test_ensure_fleet_records_and_checks_the_shard_count(
    client: redis.asyncio.Redis, fleet_name: str
) -> None:
    assert await read_fleet_meta(client, fleet_name) is None
    assert await ensure_fleet(client, fleet_name, 16) == 16
    assert await ensure_fleet(client, fleet_name, 16) == 16
    meta = await read_fleet_meta(client, fleet_name)
    assert meta is not None
    assert meta.shards == 16
    assert meta.created_at > 0
    with pytest.raises(
        ConfigError, match=f"fleet {fleet_name} was created with 16 shards.*configured with 8"
    ):
        await ensure_fleet(client, fleet_name, 8)
    pub = AsyncPublisher(client, fleet_name, 8, policy=FAST)
    with pytest.raises(ConfigError, match="created with 16 shards"):
        await pub.publish(task("orders", 0))
    assert await client.xlen(Keys(fleet_name).events(shard_of("orders", 8))) == 0


async def test_publish_routes_every_copy_to_its_shard_and_consumers_read_and_ack(
    client: redis.asyncio.Redis, fleet_name: str
) -> None:
    datasets = [f"ds{i}" for i in range(12)]
    started = JobStarted(job="job-1", datasets=datasets, timeout_s=60, started_at=1.0)
    finished = JobFinished(
        job="job-1", datasets={d: DatasetExpectation(tasks=1) for d in datasets}, finished_at=2.0
    )
    pub = AsyncPublisher(client, fleet_name, SHARDS, policy=FAST)
    ids = await pub.publish(started)
    assert len(ids) == len(split_by_shard(started, SHARDS)) == SHARDS
    await pub.publish_many([task(d, 0) for d in datasets] + [finished])

    for shard in range(SHARDS):
        c = await consumer(client, fleet_name, shard, "w1")
        entries = await c.read(100, 10)
        events = [decode_entry(e.fields, limits=LIMITS) for e in entries]
        mine = [d for d in datasets if shard_of(d, SHARDS) == shard]
        assert isinstance(events[0], JobStarted)
        assert events[0].datasets == mine
        assert [e.dataset for e in events[1:-1] if isinstance(e, TaskFinished)] == mine
        assert isinstance(events[-1], JobFinished)
        assert list(events[-1].datasets) == mine
        lag = await c.lag()
        assert (lag.length, lag.pending, lag.lag) == (len(entries), len(entries), 0)
        assert await c.ack([e.id for e in entries]) == len(entries)
        assert await c.ack([e.id for e in entries]) == 0
        assert (await c.lag()).pending == 0
        assert await c.read(100, 10) == []


async def test_publish_many_keeps_order_per_shard_across_batches(
    client: redis.asyncio.Redis, fleet_name: str
) -> None:
    datasets = datasets_on(0, SHARDS, 2) + datasets_on(1, SHARDS, 1)
    evs = [task(datasets[i % 3], i) for i in range(600)]
    pub = AsyncPublisher(client, fleet_name, SHARDS, policy=FAST)
    ids = await pub.publish_many(evs, batch=64)
    assert len(ids) == 600
    for shard in (0, 1):
        c = await consumer(client, fleet_name, shard, "w1")
        got = [decode_entry(e.fields, limits=LIMITS) for e in await c.read(1000, 10)]
        expected = [ev for ev in evs if shard_of(ev.dataset, SHARDS) == shard]
        assert got == expected


async def test_signed_messages_carry_a_valid_signature(client: redis.asyncio.Redis, fleet_name: str) -> None:
    pub = AsyncPublisher(client, fleet_name, SHARDS, secret="s3cret", policy=FAST)
    ev = task(datasets_on(2, SHARDS, 1)[0], 0)
    await pub.publish(ev)
    c = await consumer(client, fleet_name, 2, "w1")
    (entry,) = await c.read(10, 10)
    assert b"sig" in entry.fields
    assert entry.fields[b"sig"].startswith(b"t=")  # v2: bound to the fleet, the stream and the time
    limits = ValidationLimits(secret=b"s3cret", fleet=fleet_name)
    assert decode_entry(entry.fields, limits=limits, stream=c.stream, entry_id=entry.id) == ev
    with pytest.raises(InvalidMessage):  # read as if from another shard's stream
        decode_entry(entry.fields, limits=limits, stream=Keys(fleet_name).events(3), entry_id=entry.id)


async def test_restarted_consumer_rereads_its_own_pending_entries_first(
    client: redis.asyncio.Redis, fleet_name: str
) -> None:
    ds = datasets_on(0, SHARDS, 1)[0]
    pub = AsyncPublisher(client, fleet_name, SHARDS, policy=FAST)
    await pub.publish_many([task(ds, i) for i in range(5)])
    first = await consumer(client, fleet_name, 0, "w1")
    entries = await first.read(5, 10)
    await first.ack([entries[0].id, entries[2].id])

    # Same consumer name, new object (a restarted process): its pending come back, in order.
    again = await consumer(client, fleet_name, 0, "w1")
    pending = await again.read_pending(count=2)
    assert [e.id for e in pending] == [entries[1].id, entries[3].id]
    rest = await again.read_pending(count=2, after=pending[-1].id)
    assert [e.id for e in rest] == [entries[4].id]
    assert await again.read_pending(count=2, after=rest[-1].id) == []
    assert pending[0].fields == entries[1].fields

    # Another consumer does not see them, and new entries go to whoever reads.
    other = await consumer(client, fleet_name, 0, "w2")
    assert await other.read_pending() == []
    await pub.publish(task(ds, 9))
    (new,) = await again.read(10, 10)
    assert decode_entry(new.fields, limits=LIMITS) == task(ds, 9)


async def test_claim_from_takes_only_dead_consumers_entries(
    client: redis.asyncio.Redis, fleet_name: str
) -> None:
    ds = datasets_on(3, SHARDS, 1)[0]
    pub = AsyncPublisher(client, fleet_name, SHARDS, policy=FAST)
    await pub.publish_many([task(ds, i) for i in range(7)])
    dead = await consumer(client, fleet_name, 3, "dead")
    live = await consumer(client, fleet_name, 3, "live")
    dead_entries = await dead.read(4, 10)
    live_entries = await live.read(3, 10)
    assert len(dead_entries) == 4
    assert len(live_entries) == 3

    heir = await consumer(client, fleet_name, 3, "heir")
    claimed = await heir.claim_from(["dead", "never-existed"], page=3)
    assert [e.id for e in claimed] == [e.id for e in dead_entries]
    assert [e.fields for e in claimed] == [e.fields for e in dead_entries]

    infos = {c.name: c for c in await heir.consumers()}
    assert "dead" not in infos  # drained, then removed from the group
    assert infos["live"].pending == 3
    assert infos["heir"].pending == 4
    assert [e.id for e in await live.read_pending()] == [e.id for e in live_entries]
    assert [e.id for e in await heir.read_pending()] == [e.id for e in dead_entries]
    assert await heir.claim_from(["dead"]) == []


async def test_dead_letter_is_atomic_and_idempotent(client: redis.asyncio.Redis, fleet_name: str) -> None:
    keys = Keys(fleet_name)
    await ensure_fleet(client, fleet_name, SHARDS)
    c = await consumer(client, fleet_name, 1, "w1")
    stream_id = await client.xadd(keys.events(1), {b"data": b"{not json", b"reason": b"forged"})
    (entry,) = await c.read(10, 10)

    dead_id = await c.dead_letter(entry, "bad_json", "expected a JSON object")
    assert dead_id is not None
    assert (await c.lag()).pending == 0
    assert await c.read_pending() == []
    assert await c.dead_letter(entry, "bad_json", "again") is None  # already moved: nothing written
    assert await client.xlen(keys.dead(1)) == 1

    (dl,) = await read_dead_letters(client, keys)
    assert (dl.shard, dl.id, dl.stream_id) == (1, dead_id, stream_id)
    assert (dl.reason, dl.detail, dl.consumer) == ("bad_json", "expected a JSON object", "w1")
    assert dl.fields == {b"data": b"{not json", b"reason": b"forged"}
    assert await read_dead_letters(client, keys, shard=0) == []
    assert await count_dead_letters(client, keys, SHARDS) == {1: 1}


async def test_trimmed_pending_entry_reads_as_deleted_and_can_be_dead_lettered(
    client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    c = await consumer(client, fleet_name, 0, "w1")
    await client.xadd(keys.events(0), {b"data": b"{}"})
    (entry,) = await c.read(10, 10)
    await client.xdel(keys.events(0), entry.id)
    (again,) = await ShardConsumer(client, keys, 0, consumer="w1").read_pending()
    assert again == Entry(entry.id, {})
    assert again.deleted
    assert await c.dead_letter(again, "deleted", "trimmed while pending") is not None
    assert (await c.lag()).pending == 0


async def test_read_recreates_a_vanished_group(client: redis.asyncio.Redis, fleet_name: str) -> None:
    keys = Keys(fleet_name)
    c = await consumer(client, fleet_name, 0, "w1")
    await client.delete(keys.events(0))
    assert await c.read(10, 10) == []
    await client.xadd(keys.events(0), {b"data": b"{}"})
    assert len(await c.read(10, 10)) == 1


async def test_a_read_blocked_while_its_stream_is_deleted_recreates_the_group(
    client: redis.asyncio.Redis, fleet_name: str
) -> None:
    """Redis 7 ends a blocked XREADGROUP whose key is deleted (FLUSHALL, DEL) with ``UNBLOCKED ... no longer
    exists``: the read re-creates the group (it ended a worker's process before)."""
    keys = Keys(fleet_name)
    c = await consumer(client, fleet_name, 0, "w1")
    reader = asyncio.create_task(c.read(10, 5000))

    async def blocked() -> bool:
        listed: Any = await client.client_list()
        return any(b"xreadgroup" in str(cl.get("cmd", "")).encode() for cl in listed)

    await wait_for(blocked, timeout=10, what="the read to block")
    await client.delete(keys.events(0))
    assert await asyncio.wait_for(reader, 10) == []
    await client.xadd(keys.events(0), {b"data": b"{}"})
    assert len(await c.read(10, 10)) == 1


def test_sync_publisher_from_another_process(redis_url: str, fleet_name: str) -> None:
    code = f"""
import sys
from shared.events import TaskFinished, StagedFile
from shared.queue import SyncPublisher
pub = SyncPublisher.cached({redis_url!r}, {fleet_name!r}, {SHARDS}, "s3cret")
assert SyncPublisher.cached({redis_url!r}, {fleet_name!r}, {SHARDS}, "s3cret") is pub
for i in range(50):
    ev = TaskFinished(job="job-1", dataset="ds%d" % (i % 5), task=i, attempt=0,
                      files=[StagedFile(path="f", size=i)], finished_at=1.0)
    pub.publish(ev)
print(len(pub.publish_many([])))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=60
    )
    assert out.returncode == 0, out.stderr
    import redis as sync_redis

    client = keep_repeated_fields(sync_redis.Redis.from_url(redis_url))
    try:
        keys = Keys(fleet_name)
        got: list[tuple[int, QueueEvent]] = []
        for shard in range(SHARDS):
            for entry in entries_from_reply([[b"", client.xrange(keys.events(shard))]]):
                limits = ValidationLimits(secret=b"s3cret", fleet=fleet_name)
                ev = decode_entry(entry.fields, limits=limits, stream=keys.events(shard), entry_id=entry.id)
                got.append((shard, ev))
        tasks = [(shard, ev) for shard, ev in got if isinstance(ev, TaskFinished)]
        assert len(tasks) == len(got)
        assert sorted(ev.task for _, ev in tasks) == list(range(50))
        assert all(shard_of(ev.dataset, SHARDS) == shard for shard, ev in tasks)
        assert client.hget(keys.meta, "shards") == str(SHARDS).encode()
    finally:
        client.close()


async def test_raw_consume_rate_measures_and_cleans_up(client: redis.asyncio.Redis) -> None:
    rate = await raw_consume_rate(client, 2000)
    assert rate > 1000
    assert await client.keys("cf:bench-*") == []


@pytest.mark.bench
async def test_bench_raw_consume_rate(client: redis.asyncio.Redis) -> None:
    """Baseline for the worker-intake benchmark (pytest -m bench -s)."""
    rates = [await raw_consume_rate(client, 100_000) for _ in range(3)]
    print(f"raw XREADGROUP COUNT 500 + XACK: {max(rates):,.0f} entries/s (runs: {[round(r) for r in rates]})")
    assert min(rates) > 1000
