"""The shard state save: one atomic script that writes and acknowledges only for the owner,
with the next batch read behind it in the same round trip."""

from __future__ import annotations

import pytest
import redis.asyncio

from shared import Fenced
from shared.queue import DEFAULT_GROUP, Keys, ShardConsumer
from tests._support.shard_state import SHARD, owned_backlog, pending_entries, state_and_batch
from workers._core import ShardJobs, attempt_field
from workers._state_store import Batch, ShardStateStore


async def test_the_owner_writes_everything_and_acknowledges_in_one_save(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    await redis_client.set(keys.shard_state(SHARD, "owner"), b"w1@1")
    await redis_client.hset(keys.shard_state(SHARD, "jobs"), "j0", b"{}")  # ended: dropped from open jobs
    await redis_client.hset(keys.shard_state(SHARD, "attempts"), "old/ds/0/0", b"{}")
    ids = await pending_entries(redis_client, keys, 7)
    # More attempts than one Lua unpack() call takes: the script writes them in chunks.
    state, batch = state_and_batch(ids, attempts=1500)
    batch.drop_attempts.append("old/ds/0/0")
    store = ShardStateStore(redis_client, keys, SHARD, b"w1@1")

    await store.save(batch, state)

    assert (await redis_client.xpending(keys.events(SHARD), DEFAULT_GROUP))["pending"] == 0
    loaded = await store.load()
    assert loaded.jobs == state.jobs
    assert loaded.ended == state.ended
    got = {(a.task, a.attempt): a for per in loaded.attempts[("j1", "ds")].values() for a in per.values()}
    assert got == {(k[2], k[3]): v for k, v in batch.attempts.items()}
    assert await redis_client.hexists(keys.shard_state(SHARD, "attempts"), attempt_field("j1", "ds", 7, 0))
    assert not await redis_client.hexists(keys.shard_state(SHARD, "attempts"), "old/ds/0/0")
    result_key = keys.job_result(SHARD, "j0")
    assert set(await redis_client.hkeys(result_key)) == {b"ds", b"other"}
    assert await redis_client.ttl(result_key) > 0


@pytest.mark.parametrize("owner", [b"w2@2", None], ids=["new-owner", "no-owner"])
async def test_a_stale_owner_writes_nothing_and_acknowledges_nothing(
    redis_client: redis.asyncio.Redis, fleet_name: str, owner: bytes | None
) -> None:
    keys = Keys(fleet_name)
    if owner is not None:
        await redis_client.set(keys.shard_state(SHARD, "owner"), owner)
    ids = await pending_entries(redis_client, keys, 5)
    state, batch = state_and_batch(ids, attempts=3)
    store = ShardStateStore(redis_client, keys, SHARD, b"w1@1")
    before = sorted(k for k in await redis_client.keys(f"*{fleet_name}*"))

    with pytest.raises(Fenced, match="w2@2" if owner else "b''"):
        await store.save(batch, state)

    assert (await redis_client.xpending(keys.events(SHARD), DEFAULT_GROUP))["pending"] == 5
    assert sorted(await redis_client.keys(f"*{fleet_name}*")) == before


async def test_a_save_reads_the_next_entries_for_its_consumer(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store, state, batch, _, later = await owned_backlog(redis_client, keys, pending=3, later=5, attempts=2)

    ahead = await store.save(batch, state, read_next=4)

    # The batch is acknowledged; the next four are read for w1 (pending to it), in order, with their fields.
    assert [e.id for e in ahead] == later[:4]
    assert [e.fields for e in ahead] == [{b"data": f"n{i}".encode()} for i in range(4)]
    pending = await redis_client.xpending_range(keys.events(SHARD), DEFAULT_GROUP, "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(i, b"w1") for i in later[:4]]
    # Nothing more than asked for, and nothing once the stream is read to its end.
    assert [e.id for e in await store.save(Batch(ack=[e.id for e in ahead]), state, read_next=4)] == later[4:]
    assert await store.save(Batch(ack=later[4:]), state, read_next=4) == []
    assert (await redis_client.xpending(keys.events(SHARD), DEFAULT_GROUP))["pending"] == 0


async def test_a_fenced_save_writes_nothing_and_what_its_read_took_goes_to_the_owner(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store, state, batch, ids, nxt = await owned_backlog(
        redis_client, keys, owner=b"w2@2", pending=2, later=1, attempts=1
    )

    with pytest.raises(Fenced, match="w2@2"):
        await store.save(batch, state, read_next=10)

    # Nothing written, nothing acknowledged: the batch and the entry the read
    # took are all pending to w1, as after a frozen worker's read...
    assert not await redis_client.exists(keys.shard_state(SHARD, "attempts"))
    pending = await redis_client.xpending_range(keys.events(SHARD), DEFAULT_GROUP, "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(i, b"w1") for i in [*ids, *nxt]]
    # ...and the owner takes them over (what its session start and every tick do).
    owner = ShardConsumer(redis_client, keys, SHARD, consumer="w2")
    assert [e.id for e in await owner.claim_from(["w1"])] == [*ids, *nxt]


async def test_a_failed_read_ahead_does_not_fail_the_save(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    await redis_client.set(keys.shard_state(SHARD, "owner"), b"w1@1")
    ids = await pending_entries(redis_client, keys, 2)
    state, batch = state_and_batch(ids, attempts=1)
    # The group is gone (deleted by hand, say): the writes stand, the read finds nothing.
    await redis_client.xgroup_destroy(keys.events(SHARD), DEFAULT_GROUP)
    store = ShardStateStore(redis_client, keys, SHARD, b"w1@1", consumer="w1")

    assert await store.save(batch, state, read_next=10) == []
    assert await redis_client.hexists(keys.shard_state(SHARD, "attempts"), attempt_field("j1", "ds", 0, 0))


async def test_reading_ahead_needs_a_consumer(redis_client: redis.asyncio.Redis, fleet_name: str) -> None:
    store = ShardStateStore(redis_client, Keys(fleet_name), SHARD, b"w1@1")
    with pytest.raises(ValueError, match="consumer"):
        await store.save(Batch(ack=[b"1-1"]), ShardJobs(), read_next=1)


async def test_a_save_with_a_read_loads_its_script_when_redis_lost_it(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store, state, batch, _, later = await owned_backlog(redis_client, keys, pending=2, later=2, attempts=1)
    await redis_client.script_flush()  # as after a restart of Redis: the script's SHA is unknown

    assert [e.id for e in await store.save(batch, state, read_next=5)] == later
    assert await redis_client.hexists(keys.shard_state(SHARD, "attempts"), attempt_field("j1", "ds", 0, 0))
    pending = await redis_client.xpending_range(keys.events(SHARD), DEFAULT_GROUP, "-", "+", 10)
    assert [p["message_id"] for p in pending] == later
