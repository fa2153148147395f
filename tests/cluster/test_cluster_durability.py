"""``redis.durability`` on a Redis Cluster (3 masters, each with one replica): the check and a shard's save.

The check writes one byte on every master serving the fleet's keys and waits there; a shard's save sends
its script, the marker's write and the wait in one pipeline routed to the shard's master.
"""

from __future__ import annotations

import pytest

from shared import ConfigError, TransientError
from shared.queue import DEFAULT_GROUP, Keys, check_durability, connect, probe_keys
from shared.settings import Durability, RedisSettings
from tests._support.shard_state import SHARD, pending_entries, state_and_batch
from workers._state_store import ShardStateStore


async def test_the_check_and_a_save_wait_on_the_cluster(redis_cluster_url: str, fleet_name: str) -> None:
    client = connect(RedisSettings(url=redis_cluster_url))
    keys = Keys(fleet_name)
    try:
        await check_durability(client, Durability("replicas", 1, 1.0), probe_keys(keys, 16))
        with pytest.raises(ConfigError, match='"replicas" cannot be given: only 1 of 2 replicas'):
            await check_durability(client, Durability("replicas", 2, 0.1), probe_keys(keys, 16))
        with pytest.raises(
            ConfigError, match="needs WAITAOF"
        ):  # the machine's Redis 7.0, AOF off: either refuses
            await check_durability(client, Durability("aof", 0, 1.0), probe_keys(keys, 16))

        await client.set(keys.shard_state(SHARD, "owner"), b"w1@1")
        ids = await pending_entries(client, keys, 5)
        state, batch = state_and_batch(ids, attempts=3)
        store = ShardStateStore(client, keys, SHARD, b"w1@1", durability=Durability("replicas", 1, 1.0))
        # A cluster pipeline sends the script's text (redis-py refuses EVALSHA there): no script cache needed.
        await client.script_flush()
        await store.save(batch, state)
        assert (await client.xpending(keys.events(SHARD), DEFAULT_GROUP))["pending"] == 0
        assert await client.hexists(keys.job_result(SHARD, "j0"), "ds")

        ids = await pending_entries(client, keys, 2)
        state, batch = state_and_batch(ids, attempts=1)
        short = ShardStateStore(client, keys, SHARD, b"w1@1", durability=Durability("replicas", 2, 0.1))
        with pytest.raises(TransientError, match="only 1 of 2 replicas"):
            await short.save(batch, state)
        # It stands on the master (and is retried by intake; the save is idempotent).
        assert (await client.xpending(keys.events(SHARD), DEFAULT_GROUP))["pending"] == 0
    finally:
        await client.aclose()
