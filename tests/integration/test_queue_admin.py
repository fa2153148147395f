"""The capped admin stream against a real redis-server: append, cap, follow, read back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from shared import RetryPolicy
from shared.events import AdminEvent, Committed, WorkerJoined
from shared.queue import AdminPublisher, Keys, connect, follow_admin, read_admin_range
from shared.settings import RedisSettings
from tests._support.wait import wait_for


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    c = connect(RedisSettings(url=redis_url, socket_timeout=5.0))
    try:
        yield c
    finally:
        await c.aclose()


def joined(i: int) -> WorkerJoined:
    return WorkerJoined(at=float(i), worker=f"w{i}", host="h", pid=i)


async def test_admin_stream_is_capped(client: redis.asyncio.Redis, fleet_name: str) -> None:
    keys = Keys(fleet_name)
    pub = AdminPublisher(client, keys, maxlen=50, policy=RetryPolicy().no_wait())
    for i in range(600):
        await pub.publish(joined(i))
    length = await client.xlen(keys.admin)
    # MAXLEN ~ trims whole stream nodes (100 entries each by default): close to, never far above, the cap.
    assert 50 <= length <= 50 + 100
    events = await read_admin_range(client, keys)
    assert [ev for _, ev in events] == [joined(i) for i in range(600 - length, 600)]


async def test_follow_admin_from_now_and_from_the_start(client: redis.asyncio.Redis, fleet_name: str) -> None:
    keys = Keys(fleet_name)
    pub = AdminPublisher(client, keys, policy=RetryPolicy().no_wait())
    await pub.publish(joined(0))
    committed = Committed(
        at=2.0, worker="w1", dataset="orders", job="job-1", files=3, bytes=30, duration_s=0.5
    )

    async def take(it: AsyncIterator[tuple[bytes, AdminEvent]], n: int) -> list[AdminEvent]:
        out: list[AdminEvent] = []
        async for _, ev in it:
            out.append(ev)
            if len(out) == n:
                break
        return out

    live = follow_admin(client, keys, block_ms=5000)
    follower = asyncio.create_task(take(live, 2))

    async def follower_blocked() -> bool:
        clients = await client.client_list()
        return any(c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in clients)

    # "$" means after what was there when following started: wait until the follower is blocked.
    await wait_for(follower_blocked, what="the follower to block in XREAD")
    await pub.publish(joined(1))
    # Undecodable entries (e.g. an event of a newer fleet) are skipped, not fatal.
    await client.xadd(keys.admin, {b"data": b'{"type":"from_the_future","v":1,"at":1}'})
    await client.xadd(keys.admin, {b"other": b"x"})
    await pub.publish(committed)
    async with asyncio.timeout(10):
        assert await follower == [joined(1), committed]
    await live.aclose()

    replay = follow_admin(client, keys, from_id="0", block_ms=50)
    async with asyncio.timeout(10):
        assert await take(replay, 3) == [joined(0), joined(1), committed]
    await replay.aclose()

    rows = await read_admin_range(client, keys, count=2)
    assert [ev for _, ev in rows] == [joined(0), joined(1)]
    after = await read_admin_range(client, keys, start=b"(" + rows[-1][0])
    assert [ev for _, ev in after] == [committed]
