"""Saves sent ahead (workers._save_pipe): the same fenced save, its replies read later."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from shared import Fenced
from shared.queue import DEFAULT_GROUP, Keys, ShardConsumer
from tests._support.shard_state import SHARD, owned_backlog
from workers._core import ShardJobs, attempt_field
from workers._save_pipe import send_save
from workers._state_store import Batch


async def test_a_save_sent_ahead_writes_acknowledges_and_reads_behind_it(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store, state, batch, _, later = await owned_backlog(redis_client, keys, pending=3, later=5, attempts=2)
    assert store.sends_ahead

    sent = await send_save(store, store.prepare(batch, state), 4)
    state.jobs.clear()  # a change after prepare (the next batch judged) is not in this save
    got = await sent.result()

    assert [e.id for e in got] == later[:4]
    assert [e.fields for e in got] == [{b"data": f"n{i}".encode()} for i in range(4)]
    assert await redis_client.hexists(keys.shard_state(SHARD, "jobs"), "j1")
    assert await redis_client.hexists(keys.shard_state(SHARD, "attempts"), attempt_field("j1", "ds", 1, 0))
    pending = await redis_client.xpending_range(keys.events(SHARD), DEFAULT_GROUP, "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(i, b"w1") for i in later[:4]]
    # Without a read: nothing read, the save made all the same.
    sent = await send_save(store, store.prepare(Batch(ack=later[:4]), state), 0)
    assert await sent.result() == []
    assert (await redis_client.xpending(keys.events(SHARD), DEFAULT_GROUP))["pending"] == 0


async def test_a_fenced_save_sent_ahead_writes_nothing(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store, state, batch, ids, nxt = await owned_backlog(
        redis_client, keys, owner=b"w2@2", pending=2, later=1, attempts=1
    )

    sent = await send_save(store, store.prepare(batch, state), 10)
    with pytest.raises(Fenced, match="w2@2"):
        await sent.result()

    assert not await redis_client.exists(keys.shard_state(SHARD, "attempts"))
    owner = ShardConsumer(redis_client, keys, SHARD, consumer="w2")
    assert [e.id for e in await owner.claim_from(["w1"])] == [*ids, *nxt]


async def test_a_save_sent_ahead_loads_its_script_when_redis_lost_it(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store, state, batch, _, later = await owned_backlog(redis_client, keys, pending=2, later=2, attempts=1)
    await redis_client.script_flush()

    sent = await send_save(store, store.prepare(batch, state), 5)
    assert [e.id for e in await sent.result()] == later
    assert await redis_client.hexists(keys.shard_state(SHARD, "attempts"), attempt_field("j1", "ds", 0, 0))


def _in_use(r: redis.asyncio.Redis) -> int:
    return len(r.connection_pool._in_use_connections)


@pytest.mark.parametrize("how", ["abandoned", "cancelled"])
async def test_a_save_whose_replies_are_not_read_gives_its_connection_back_closed(
    redis_client: redis.asyncio.Redis, fleet_name: str, how: str
) -> None:
    keys = Keys(fleet_name)
    store, state, batch, ids, _ = await owned_backlog(redis_client, keys, pending=2, attempts=1)
    before = _in_use(redis_client)

    # Writes paused: the save's reply cannot come before we give up on it.
    await redis_client.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
    try:
        sent = await send_save(store, store.prepare(batch, state), 5)
        assert _in_use(redis_client) == before + 1
        if how == "abandoned":
            await sent.abandon()
            await sent.abandon()  # twice: nothing more
        else:
            reading = asyncio.create_task(sent.result())
            await asyncio.sleep(0.05)  # reading: waits for the reply
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
        assert _in_use(redis_client) == before
    finally:
        await redis_client.execute_command("CLIENT", "UNPAUSE")
    # The pool serves the next save; nothing of the dropped replies reaches it.
    sent = await send_save(store, store.prepare(Batch(ack=ids), ShardJobs()), 0)
    assert await sent.result() == []
    assert await redis_client.ping()
