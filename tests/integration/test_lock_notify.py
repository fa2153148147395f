"""Release notices across processes over Redis pub/sub: a waiter elsewhere looks at once; without
Redis the lock works as before (polling)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import redis.asyncio

from shared.locks import RedisReleaseNotifier, StorageLock
from shared.storage._local import LocalStore
from tests._support.locks import SLOW_POLL, OtherProcess


async def test_a_waiter_in_another_process_is_told_by_the_release_notice(
    tmp_path: Path, redis_url: str
) -> None:
    inner = LocalStore(tmp_path / "s", durable=False)
    client = redis.asyncio.Redis.from_url(redis_url)
    notifier = RedisReleaseNotifier(client, f"test-{secrets.token_hex(3)}")
    try:
        holder = await StorageLock(inner, "ds", owner="a", settings=SLOW_POLL, notifier=notifier).acquire()
        elsewhere = OtherProcess(inner)
        waiter = asyncio.create_task(
            StorageLock(elsewhere, "ds", owner="b", settings=SLOW_POLL, notifier=notifier).acquire()
        )
        # The waiter has looked once (held) and is subscribed; its next poll is 30 s away.
        await asyncio.wait_for(_subscribed(client, notifier.channel("ds")), timeout=10)
        await holder.release()
        async with asyncio.timeout(10):
            lease = await waiter
        assert (lease.owner, lease.epoch) == ("b", 2)
        await lease.release()
    finally:
        await client.aclose()


async def _subscribed(client: redis.asyncio.Redis, channel: str) -> None:
    while not (await client.pubsub_numsub(channel))[0][1]:
        await asyncio.sleep(0.02)


async def test_without_redis_the_lock_works_as_before(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s", durable=False)
    client = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    notifier = RedisReleaseNotifier(client, "nowhere")
    try:
        fast = StorageLock(store, "ds", owner="a", settings=SLOW_POLL, notifier=notifier)
        async with fast.hold() as lease:
            assert lease.epoch == 1
        async with asyncio.timeout(10):
            async with StorageLock(
                store, "ds", owner="b", settings=SLOW_POLL, notifier=notifier
            ).hold() as again:
                assert again.epoch == 2
    finally:
        await client.aclose()
