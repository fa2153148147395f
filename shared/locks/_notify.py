"""Release notices across processes: an optional Redis pub/sub channel per lock name.

The lock never depends on it: a :class:`StorageLock` given no notifier (or one
whose Redis is down) polls as always. With one, a release publishes a notice
on ``<namespace>:lock-released:<name>`` after the release write has landed,
and a waiting acquirer subscribes to that channel for the time of its wait: a
notice wakes it like an in-process release does (see
:class:`~._io.ReleaseBoard`), and it looks at the lock at once. A lost notice
costs nothing but the wait until the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import redis.asyncio
import redis.exceptions

from .._aio import TaskGroup

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
        except (redis.exceptions.RedisError, OSError) as exc:
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
            except (redis.exceptions.RedisError, OSError) as exc:
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
        except (redis.exceptions.RedisError, OSError) as exc:
            log.info("lock %s: release notices stopped: %r", name, exc)


__all__ = ["RedisReleaseNotifier", "ReleaseNotifier"]
