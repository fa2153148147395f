"""The shared release notifier under a Redis that dies: waiters come and go on many channels while the
server's pub/sub connections are cut (CLIENT KILL TYPE pubsub) and the server is SIGKILLed and restarted.

run() must never end, no waiter may ever see an error, and after every recovery the watched channels are
subscribed again (including those first watched while Redis was down) and their notices arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import secrets
from collections.abc import Callable

import redis.asyncio

from shared._aio import cancel_until_done
from shared._retry import RetryPolicy
from shared.locks import SharedReleaseNotifier
from shared.queue import connect
from shared.settings import RedisSettings
from tests._support.redis_server import RedisServer
from tests._support.wait import wait_for

CHANNELS = 12
HAMMERS = 24
KILLS = 4
CUTS = 6


async def _subscribed(client: redis.asyncio.Redis, channel: str) -> bool:
    with contextlib.suppress(redis.exceptions.ConnectionError):
        return int((await client.pubsub_numsub(channel))[0][1]) > 0
    return False


async def _hammer(notifier: SharedReleaseNotifier, rng: random.Random, stop: asyncio.Event) -> int:
    """Watch random channels for random short spells until ``stop``; return how many spells."""
    spells = 0
    while not stop.is_set():
        event = asyncio.Event()
        async with notifier.watch(f"h{rng.randrange(CHANNELS)}", event):
            # Load, not synchronisation: spells short and long enough to straddle reads and cuts.
            await asyncio.sleep(rng.choice((0.0, 0.0, 0.001, 0.005, 0.02)))
        spells += 1
    return spells


async def _told(
    notifier: SharedReleaseNotifier, client: redis.asyncio.Redis, name: str, event: asyncio.Event
) -> None:
    """Publish a release of ``name`` until Redis says a subscriber got it, then wait for ``event``."""
    channel = notifier.channel(name)
    event.clear()

    async def published() -> bool:
        with contextlib.suppress(redis.exceptions.ConnectionError):
            return int(await client.publish(channel, b"1")) > 0
        return False

    await wait_for(published, timeout=20, what=f"a subscriber of {name}")
    try:
        async with asyncio.timeout(10):
            await event.wait()
    except TimeoutError:
        raise AssertionError(f"no notice of {name} within 10 s of its delivery to a subscriber") from None


async def test_waiters_survive_redis_kills_and_cut_connections(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    settings = RedisSettings(url=server.url, socket_timeout=2.0)
    client = connect(settings, client_name="notifier")  # configured as a worker's client
    probe = connect(settings, client_name="probe")
    notifier = SharedReleaseNotifier(
        client, f"test-{secrets.token_hex(3)}", retry=RetryPolicy(initial=0.02, maximum=0.2)
    )
    stop = asyncio.Event()
    reader = asyncio.create_task(notifier.run())
    hammers = [asyncio.create_task(_hammer(notifier, random.Random(i), stop)) for i in range(HAMMERS)]

    def check_alive() -> None:
        for task in (reader, *hammers):
            if task.done():
                task.result()  # raises what ended it
                raise AssertionError(f"{task.get_coro()!r} ended on its own")

    try:
        try:
            await _chaos(notifier, server, probe, check_alive)
        except AssertionError:
            check_alive()  # a task that died explains the failure better
            raise
        stop.set()
        spells = await asyncio.gather(*hammers)
        assert sum(spells) > HAMMERS * 10, f"the hammers barely ran: {spells}"
        assert not reader.done()
        # Every spell ended: nothing is watched any more, so run() unsubscribes every lock channel.
        for name in ("steady", *(f"h{c}" for c in range(CHANNELS))):
            channel = notifier.channel(name)
            gone = functools.partial(_not_subscribed, probe, channel)
            await wait_for(gone, timeout=10, what=f"{name} unsubscribed")
    finally:
        stop.set()
        for hammer in hammers:
            hammer.cancel()
        await asyncio.gather(*hammers, return_exceptions=True)
        await cancel_until_done(reader)
        await client.aclose()
        await probe.aclose()
    # A cancel ends run() as a cancellation, never as a return or another error.
    assert reader.cancelled()


async def _not_subscribed(client: redis.asyncio.Redis, channel: str) -> bool:
    return not await _subscribed(client, channel)


async def _chaos(
    notifier: SharedReleaseNotifier,
    server: RedisServer,
    probe: redis.asyncio.Redis,
    check_alive: Callable[[], None],
) -> None:
    steady = asyncio.Event()
    async with notifier.watch("steady", steady):
        await _told(notifier, probe, "steady", steady)
        for i in range(CUTS):
            await probe.client_kill_filter(_type="pubsub")
            cut = asyncio.Event()
            async with notifier.watch(f"cut{i}", cut):
                await _told(notifier, probe, f"cut{i}", cut)
                await _told(notifier, probe, "steady", steady)
            check_alive()
        for i in range(KILLS):
            server.kill()
            check_alive()
            # Watched first while Redis is down: polled meanwhile, subscribed after recovery.
            late = asyncio.Event()
            async with notifier.watch(f"late{i}", late):
                await asyncio.sleep(0.05)  # load: let the hammers and run() meet the dead server
                server.start()
                await _told(notifier, probe, f"late{i}", late)
                await _told(notifier, probe, "steady", steady)
            check_alive()
