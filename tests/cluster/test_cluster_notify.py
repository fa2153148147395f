"""Lock release notices through a Redis Cluster client (what workers use there): the shared notifier's
run() reads a ClusterPubSub, a notice published through the cluster wakes a waiter, and the channel is
unsubscribed after its last waiter leaves."""

from __future__ import annotations

import asyncio
import secrets

from shared._aio import cancel_until_done
from shared.locks import SharedReleaseNotifier
from shared.queue import connect
from shared.settings import RedisSettings
from tests._support.wait import wait_for


async def test_a_release_notice_reaches_a_waiter_through_the_cluster(redis_cluster_url: str) -> None:
    client = connect(RedisSettings(url=redis_cluster_url))
    notifier = SharedReleaseNotifier(client, f"test-{secrets.token_hex(3)}")
    reader = asyncio.create_task(notifier.run())
    event = asyncio.Event()
    try:
        async with notifier.watch("ds", event):

            async def told() -> bool:
                await notifier.released("ds")  # until run() has subscribed, nobody hears it
                return event.is_set()

            await wait_for(told, timeout=20, interval=0.1, what="the notice")
        assert not reader.done(), reader
    finally:
        await cancel_until_done(reader)
        await client.aclose()
    assert reader.cancelled()
