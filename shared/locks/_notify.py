"""Release notices across processes: an optional Redis pub/sub channel per lock name.

The lock never depends on it: a :class:`StorageLock` given no notifier (or one
whose Redis is down) polls as always. With one, a release publishes a notice
on ``<namespace>:lock-released:<name>`` after the release write has landed,
and a waiting acquirer subscribes to that channel for the time of its wait: a
notice wakes it like an in-process release does (see
:class:`~._io.ReleaseBoard`), and it looks at the lock at once. A lost notice
costs nothing but the wait until the next poll.

Two implementations: :class:`RedisReleaseNotifier` holds one subscription
connection per waiting acquirer (nothing to run); :class:`SharedReleaseNotifier`
(what workers use) holds one connection per process, read by its
:meth:`~SharedReleaseNotifier.run` task, so an uncontended acquire costs one
SUBSCRIBE and one UNSUBSCRIBE sent on it (no reply awaited), not a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import redis.asyncio
import redis.exceptions

from .._aio import TaskGroup
from .._redis_py import CAUGHT, is_redis_failure
from ._io import run_shielded

log = logging.getLogger("shared.locks")


class ReleaseNotifier(Protocol):
    """Tells waiters elsewhere that a lock was released (best effort)."""

    async def released(self, name: str) -> None:
        """Announce that lock ``name`` was released. Never raises for a failed announcement."""

    def watch(self, name: str, event: asyncio.Event) -> contextlib.AbstractAsyncContextManager[None]:
        """While entered, set ``event`` whenever a release of ``name`` is announced."""


class RedisReleaseNotifier:
    """:class:`ReleaseNotifier` over Redis pub/sub (``PUBLISH`` / ``SUBSCRIBE``), one channel per lock name.

    ``namespace`` keeps fleets apart (the fleet name). Each waiting acquirer
    holds one subscription (one pub/sub connection) while it waits.
    """

    def __init__(self, redis_client: redis.asyncio.Redis, namespace: str) -> None:
        self._redis = redis_client
        self._namespace = namespace

    def channel(self, name: str) -> str:
        """Return the channel of lock ``name``."""
        return f"{self._namespace}:lock-released:{name}"

    async def released(self, name: str) -> None:
        """Publish the notice; a Redis failure is logged, not raised (waiters fall back to polling)."""
        try:
            await self._redis.publish(self.channel(name), b"1")
        except CAUGHT as exc:
            if not is_redis_failure(exc):
                raise
            log.info("lock %s: release notice not published: %r", name, exc)

    @contextlib.asynccontextmanager
    async def watch(self, name: str, event: asyncio.Event) -> AsyncIterator[None]:
        """Subscribe for the block's duration; each notice sets ``event``.

        A failure to subscribe or to read is logged and ends the watching
        (the waiter polls). Cancelled: the reader is cancelled and the
        subscription closed.
        """
        pubsub = self._redis.pubsub()
        try:
            try:
                await pubsub.subscribe(self.channel(name))
            except CAUGHT as exc:
                if not is_redis_failure(exc):
                    raise
                log.info("lock %s: not subscribed to release notices: %r", name, exc)
                yield
                return
            async with TaskGroup() as tg:
                reader = tg.create_task(self._read(pubsub, name, event))
                try:
                    yield
                finally:
                    reader.cancel()
        finally:
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

    @staticmethod
    async def _read(pubsub: redis.asyncio.client.PubSub, name: str, event: asyncio.Event) -> None:
        try:
            while True:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None and msg.get("type") == "message":
                    event.set()
        except CAUGHT as exc:
            if not is_redis_failure(exc):
                raise
            log.info("lock %s: release notices stopped: %r", name, exc)


class SharedReleaseNotifier:
    """:class:`ReleaseNotifier` over ONE Redis pub/sub connection per process.

    :meth:`run` must be running (a long-lived task of the process) for
    notices to arrive; while it is not (not started yet, or Redis is down and
    it is reconnecting), :meth:`watch` sets nothing and waiters poll.
    Channels are those of :class:`RedisReleaseNotifier` (the two interoperate).
    Not thread-safe: one event loop.
    """

    def __init__(self, redis_client: redis.asyncio.Redis, namespace: str, *, retry_s: float = 1.0) -> None:
        self._redis = redis_client
        self._namespace = namespace
        self._retry_s = retry_s
        self._pubsub: redis.asyncio.client.PubSub | None = None
        self._waiters: dict[bytes, set[asyncio.Event]] = {}
        self._publisher = RedisReleaseNotifier(redis_client, namespace)

    def channel(self, name: str) -> str:
        """Return the channel of lock ``name``."""
        return self._publisher.channel(name)

    async def released(self, name: str) -> None:
        """Publish the notice; a Redis failure is logged, not raised (waiters fall back to polling)."""
        await self._publisher.released(name)

    @contextlib.asynccontextmanager
    async def watch(self, name: str, event: asyncio.Event) -> AsyncIterator[None]:
        """Register ``event`` for notices of ``name`` for the block's duration.

        The first watcher of a channel sends SUBSCRIBE, the last one out
        UNSUBSCRIBE, on the shared connection, without waiting for Redis's
        confirmation: a release that lands before the subscription is active
        is caught by the waiter's next poll. A failure to send is logged and
        the waiter polls.
        """
        channel = self.channel(name).encode()
        waiters = self._waiters.setdefault(channel, set())
        waiters.add(event)
        try:
            if len(waiters) == 1:
                await self._send("subscribe", channel)
            yield
        finally:
            waiters.discard(event)
            if not waiters and self._waiters.get(channel) is waiters:
                del self._waiters[channel]
                await self._send("unsubscribe", channel)

    async def _send(self, what: str, channel: bytes) -> None:
        pubsub = self._pubsub
        if pubsub is None:
            return  # not running: run() subscribes to every watched channel when it (re)connects
        conn: Any = pubsub.connection  # typed None by redis-py until it connects
        if conn is None or not conn.is_connected:
            # Sending now would make redis-py reconnect (and read the handshake) here while
            # run() reads the same connection; run() re-subscribes everything when it reconnects.
            return
        try:
            if what == "subscribe":
                await pubsub.subscribe(channel)
            else:
                await pubsub.unsubscribe(channel)
        except CAUGHT as exc:
            if not is_redis_failure(exc):
                raise
            log.info("lock release notices: %s %s not sent: %r", what, channel.decode(), exc)

    async def run(self) -> None:
        """Read notices and wake the waiters of their lock until cancelled; never returns.

        A Redis failure closes the connection and, after ``retry_s``, opens a
        new one subscribed to every channel watched at that time (waiters poll
        meanwhile). Cancelled: the connection is closed.
        """
        # A channel of our own keeps the connection subscribed while nothing is watched
        # (redis-py refuses to read a pub/sub connection that has no subscription).
        idle = f"{self._namespace}:lock-released".encode()
        while True:
            pubsub = self._redis.pubsub()
            try:
                subscribed = list(self._waiters)
                await pubsub.subscribe(idle, *subscribed)
                self._pubsub = pubsub
                # Watchers that came or left while we subscribed sent nothing (no connection yet).
                late = [c for c in self._waiters if c not in subscribed]
                gone = [c for c in subscribed if c not in self._waiters]
                if late:
                    await pubsub.subscribe(*late)
                if gone:
                    await pubsub.unsubscribe(*gone)
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        for event in self._waiters.get(msg["channel"], ()):
                            event.set()
            except CAUGHT as exc:
                if not is_redis_failure(exc):
                    raise
                log.info("lock release notices interrupted, waiters poll meanwhile: %r", exc)
            finally:
                self._pubsub = None
                with contextlib.suppress(redis.exceptions.RedisError, OSError):
                    await run_shielded(pubsub.aclose())  # type: ignore[no-untyped-call]
            await asyncio.sleep(self._retry_s)


__all__ = ["RedisReleaseNotifier", "ReleaseNotifier", "SharedReleaseNotifier"]
