"""SharedReleaseNotifier.run(): redis-py's failures are retried for ever, our bugs end it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio.cluster

from shared._aio import cancel_until_done
from shared._retry import RetryPolicy
from shared.locks import SharedReleaseNotifier
from tests._support.ports import free_port
from tests._support.wait import wait_for

FAST = RetryPolicy(initial=0.01, maximum=0.02)


class _EmptySlotMap:
    """A client whose pub/sub trips over an empty cluster slot map: redis-py's own KeyError (a cluster
    client between two slot-map refreshes)."""

    def __init__(self) -> None:
        self.cluster = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=free_port())
        self.opened = 0

    async def initialize(self) -> _EmptySlotMap:
        return self

    def pubsub(self) -> Any:
        self.opened += 1
        return self.cluster.pubsub()


class _Buggy(_EmptySlotMap):
    def pubsub(self) -> Any:
        self.opened += 1
        return _BuggyPubSub()


class _BuggyPubSub:
    async def subscribe(self, *channels: bytes) -> None:
        raise KeyError("ours")

    async def aclose(self) -> None:
        pass


async def test_redis_py_tripping_over_its_slot_map_is_retried() -> None:
    client = _EmptySlotMap()
    notifier = SharedReleaseNotifier(client, "f", retry=FAST)  # type: ignore[arg-type]
    reader = asyncio.create_task(notifier.run())
    try:

        async def reopened() -> bool:
            if reader.done():
                reader.result()
            return client.opened >= 3

        await wait_for(reopened, timeout=10, what="run() to try again")
    finally:
        await cancel_until_done(reader)
    assert reader.cancelled()


async def test_our_own_lookup_error_ends_run() -> None:
    notifier = SharedReleaseNotifier(_Buggy(), "f", retry=FAST)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="ours"):
        async with asyncio.timeout(10):
            await notifier.run()
