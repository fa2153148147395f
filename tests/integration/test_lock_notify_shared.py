"""Release notices on one shared pub/sub connection per process (what workers use): a waiter in another
process is woken by the release, the connection survives being cut, and the handoff is measured."""

from __future__ import annotations

import asyncio
import functools
import secrets
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio

from shared import RetryPolicy
from shared._aio import cancel_until_done
from shared.locks import SharedReleaseNotifier, StorageLock
from shared.settings import LockSettings
from shared.storage import ObjectStore
from shared.storage._latency import LatencyModel, LatencyStore
from shared.storage._local import LocalStore
from tests._support.locks import SLOW_POLL, OtherProcess
from tests._support.wait import wait_for


@asynccontextmanager
async def _running(
    redis_url: str, namespace: str | None = None
) -> AsyncIterator[tuple[SharedReleaseNotifier, redis.asyncio.Redis]]:
    client = redis.asyncio.Redis.from_url(redis_url)
    namespace = namespace or f"test-{secrets.token_hex(3)}"
    notifier = SharedReleaseNotifier(client, namespace, retry=RetryPolicy(initial=0.05))
    task = asyncio.create_task(notifier.run())
    try:
        yield notifier, client
    finally:
        await cancel_until_done(task)
        await client.aclose()


async def _subscribers(client: redis.asyncio.Redis, channel: str) -> int:
    return int((await client.pubsub_numsub(channel))[0][1])


async def _handoff(
    holder_store: ObjectStore,
    waiter_store: ObjectStore,
    name: str,
    notifier: SharedReleaseNotifier,
    client: redis.asyncio.Redis,
    settings: LockSettings,
) -> float:
    """Return the seconds from the holder's release to the waiter (elsewhere) holding the lock."""
    holder = await StorageLock(holder_store, name, owner="a", settings=settings, notifier=notifier).acquire()
    waiter = asyncio.create_task(
        StorageLock(waiter_store, name, owner="b", settings=settings, notifier=notifier).acquire()
    )
    channel = notifier.channel(name)
    await wait_for(lambda: _subscribers(client, channel), timeout=10, what="the waiter's subscription")
    await holder.release()
    released = time.monotonic()
    async with asyncio.timeout(20):
        lease = await waiter
    gap = time.monotonic() - released
    assert (lease.owner, lease.epoch) == ("b", 2)
    await lease.release()
    return gap


async def test_a_waiter_elsewhere_is_woken_through_the_shared_connection(
    tmp_path: Path, redis_url: str
) -> None:
    inner = LocalStore(tmp_path / "s", durable=False)
    async with _running(redis_url) as (notifier, client):
        # Its next poll is 30 s away: only the notice explains a prompt handoff.
        await _handoff(inner, OtherProcess(inner), "ds", notifier, client, SLOW_POLL)
        # The last watcher out unsubscribed.
        await wait_for(
            lambda: _no_subscriber(client, notifier.channel("ds")), timeout=10, what="unsubscribed"
        )


async def _no_subscriber(client: redis.asyncio.Redis, channel: str) -> bool:
    return await _subscribers(client, channel) == 0


async def test_a_cut_connection_is_reopened_with_the_watched_channels(tmp_path: Path, redis_url: str) -> None:
    inner = LocalStore(tmp_path / "s", durable=False)
    async with _running(redis_url) as (notifier, client):
        holder = await StorageLock(inner, "ds", owner="a", settings=SLOW_POLL, notifier=notifier).acquire()
        waiter = asyncio.create_task(
            StorageLock(OtherProcess(inner), "ds", owner="b", settings=SLOW_POLL, notifier=notifier).acquire()
        )
        channel = notifier.channel("ds")
        await wait_for(lambda: _subscribers(client, channel), timeout=10, what="the waiter's subscription")
        await client.client_kill_filter(_type="pubsub")
        # Reconnected (after retry_s) and subscribed again to what is watched.
        await wait_for(lambda: _no_subscriber(client, channel), timeout=10, what="the cut")
        await wait_for(lambda: _subscribers(client, channel), timeout=10, what="the new subscription")
        await holder.release()
        async with asyncio.timeout(10):
            lease = await waiter
        assert lease.owner == "b"
        await lease.release()


async def test_without_the_reader_running_a_free_lock_is_taken_as_always(
    tmp_path: Path, redis_url: str
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        notifier = SharedReleaseNotifier(client, "not-running")
        async with StorageLock(
            LocalStore(tmp_path / "s"), "ds", owner="a", settings=SLOW_POLL, notifier=notifier
        ).hold() as lease:
            assert lease.epoch == 1
    finally:
        await client.aclose()


@pytest.mark.bench
async def test_cross_process_handoff_time_in_round_trips(tmp_path: Path, redis_url: str) -> None:
    """Handoff time across processes with release notices and with polling alone, interleaved in one run.

    Each "process" has its own client and notifier (the holder publishes on its own connection, the
    waiter hears it on its notifier's); the waiter's store is seen under another name, so this
    process's in-process wake-ups do not reach it. Times are in modelled round trips (20 ms median).
    """
    median = 0.02
    store = LatencyStore(LocalStore(tmp_path / "s", durable=False), LatencyModel(median, median * 5, seed=1))
    elsewhere = OtherProcess(store)
    settings = LockSettings()  # the default poll bounds: 0.05 s .. 2 s
    gaps: dict[str, list[float]] = {"notice": [], "polling": []}
    fleet = f"test-{secrets.token_hex(3)}"
    async with _running(redis_url, fleet) as (here, _c1), _running(redis_url, fleet) as (there, client):
        for i in range(16):
            mode = "notice" if i % 2 == 0 else "polling"
            holder = await StorageLock(store, f"h{i}", owner="a", settings=settings, notifier=here).acquire()
            waiter_notifier = there if mode == "notice" else None
            waiter = asyncio.create_task(
                StorageLock(
                    elsewhere, f"h{i}", owner="b", settings=settings, notifier=waiter_notifier
                ).acquire()
            )
            if mode == "notice":
                subscribed = functools.partial(_subscribers, client, there.channel(f"h{i}"))
                await wait_for(subscribed, timeout=10, what="the subscription")
            await asyncio.sleep(1.5)  # load: the waiter is deep in its backoff (up to poll_max)
            await holder.release()
            released = time.monotonic()
            lease = await waiter
            gaps[mode].append((time.monotonic() - released) / median)
            await lease.release()
    notice, polling = (statistics.median(gaps[m]) for m in ("notice", "polling"))
    print(
        f"\nlock handoff across processes, {median * 1000:g} ms median store, same run:"
        f" release notice p50 {notice:.1f} round trips (max {max(gaps['notice']):.1f});"
        f" polling alone p50 {polling:.1f} (max {max(gaps['polling']):.1f}); ratio {polling / notice:.1f}x"
    )
