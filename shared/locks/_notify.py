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
(what workers use) holds one connection per process, owned by its
:meth:`~SharedReleaseNotifier.run` task, so a wait costs one SUBSCRIBE and one
UNSUBSCRIBE that run() sends for it (no reply awaited), not a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from typing import Any, NoReturn, Protocol

import redis.asyncio
import redis.exceptions

from .._aio import TaskGroup, cancel_until_done, raise_if_cancelling, run_shielded
from .._redis_py import CAUGHT, is_redis_failure
from .._retry import RetryPolicy

log = logging.getLogger("shared.locks")

# Reconnection pace of SharedReleaseNotifier.run (capped, jittered; it never gives up).
RECONNECT = RetryPolicy(initial=0.1, maximum=5.0)
# Longest read between two looks at what is watched, so about the most a new watcher waits for its
# SUBSCRIBE. A waiter's own polls are 0.05-0.2 s apart that early in its wait, so a longer lag would
# cost little; each empty read costs CPU (about 0.3 ms on a loaded machine: 3 ms a second at 0.1 s).
READ_S = 0.1


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
                    # Until it has ended (a cancel can be lost inside a redis-py call on 3.11).
                    await cancel_until_done(reader)
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

    Only :meth:`run` ever touches that connection (connects, SUBSCRIBEs,
    UNSUBSCRIBEs, reads), so no two coroutines can meet on it: redis-py
    reconnects a pub/sub connection from whichever coroutine uses it next,
    and two of them reading one socket crash (``read() called while another
    coroutine is already waiting``). :meth:`watch` only records, in memory,
    which events wait on which channel; :meth:`run` applies the changes
    between short reads. While :meth:`run` is not running, or Redis is down,
    watching sets nothing and waiters poll; a channel watched meanwhile is
    subscribed when :meth:`run` connects. Channels are those of
    :class:`RedisReleaseNotifier` (the two interoperate). Not thread-safe:
    one event loop.
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        namespace: str,
        *,
        retry: RetryPolicy = RECONNECT,
        read_s: float = READ_S,
    ) -> None:
        """``retry`` paces reconnections (only its delays are used: :meth:`run` never gives up);
        ``read_s`` bounds how long a new watcher waits for its SUBSCRIBE to be sent."""
        self._redis = redis_client
        self._namespace = namespace
        self._retry = retry
        self._read_s = read_s
        self._waiters: dict[bytes, set[asyncio.Event]] = {}
        self._changed = False  # the set of watched channels changed since run() last looked
        self._publisher = RedisReleaseNotifier(redis_client, namespace)

    def channel(self, name: str) -> str:
        """Return the channel of lock ``name``."""
        return self._publisher.channel(name)

    async def released(self, name: str) -> None:
        """Publish the notice; a Redis failure is logged, not raised (waiters fall back to polling)."""
        await self._publisher.released(name)

    @contextlib.asynccontextmanager
    async def watch(self, name: str, event: asyncio.Event) -> AsyncIterator[None]:
        """Register ``event`` for notices of ``name`` for the block's duration; no I/O, never raises.

        :meth:`run` subscribes the channel within about ``read_s`` of its first
        watcher and unsubscribes it after its last one leaves; a release that
        lands before the subscription is active is caught by the waiter's next
        poll.
        """
        channel = self.channel(name).encode()
        waiters = self._waiters.get(channel)
        if waiters is None:
            waiters = self._waiters[channel] = set()
            self._changed = True
        waiters.add(event)
        try:
            yield
        finally:
            waiters.discard(event)
            if not waiters and self._waiters.get(channel) is waiters:
                del self._waiters[channel]
                self._changed = True

    async def run(self) -> None:
        """Read notices and wake the waiters of their lock until cancelled; never returns.

        A Redis failure (or redis-py tripping over a connection closed under
        it, or over a cluster slot map being rebuilt) is logged; the
        connection is closed and a new one, subscribed to every channel
        watched by then, is opened after a capped jittered backoff
        (``retry``), for as long as it takes. Waiters poll meanwhile.

        Raises:
            CancelledError: when cancelled (the connection is closed first,
                shielded). Anything that is not a Redis failure (a bug)
                propagates as well.
        """
        rng = random.Random()
        failures = 0  # in a row, since the last connection that got subscribed
        while True:
            pubsub = self._redis.pubsub()
            try:
                subscribed = await self._open(pubsub)
                failures = 0
                await self._serve(pubsub, subscribed)
            except CAUGHT as exc:
                if not is_redis_failure(exc):
                    raise
                delay = self._retry.delay(failures, rng)
                failures += 1
                log.info(
                    "lock release notices interrupted, waiters poll meanwhile; reconnecting in %.2fs: %r",
                    delay,
                    exc,
                )
            finally:
                with contextlib.suppress(redis.exceptions.RedisError, OSError):
                    await run_shielded(pubsub.aclose())  # type: ignore[no-untyped-call]
            await asyncio.sleep(delay)

    async def _open(self, pubsub: redis.asyncio.client.PubSub) -> set[bytes]:
        """Connect and subscribe to every channel watched now; return those channels."""
        # A channel of our own keeps the connection subscribed while nothing is watched
        # (redis-py refuses to read a pub/sub connection that was never subscribed).
        idle = f"{self._namespace}:lock-released".encode()
        # A cluster client learns the slot map lazily; its pub/sub looks a node up in that map
        # and trips over an empty one (KeyError) when nothing else has used the client yet.
        await self._redis.initialize()
        self._changed = False
        subscribed = set(self._waiters)
        await pubsub.subscribe(idle, *subscribed)
        return subscribed

    async def _serve(self, pubsub: redis.asyncio.client.PubSub, subscribed: set[bytes]) -> NoReturn:
        """Read notices and apply watch changes between reads, for ever.

        Raises whatever the connection raises (the caller tells Redis failures from bugs).
        """
        while True:
            if self._changed:
                self._changed = False
                wanted = set(self._waiters)
                new, gone = wanted - subscribed, subscribed - wanted
                subscribed = wanted
                # Sent without waiting for Redis's confirmation (it arrives as a message, skipped).
                if new:
                    await pubsub.subscribe(*new)
                if gone:
                    await pubsub.unsubscribe(*gone)
            _check_connected(pubsub)
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._read_s)
            raise_if_cancelling()
            if msg is not None and msg.get("type") == "message":
                for event in self._waiters.get(msg["channel"], ()):
                    event.set()


def _check_connected(pubsub: redis.asyncio.client.PubSub) -> None:
    """Raise ConnectionError when the connection is down; return otherwise.

    redis-py would reconnect it silently on the next read and re-subscribe only
    what it remembers (not what is watched now); a fresh connection does it right.
    """
    conn: Any = pubsub.connection  # typed None by redis-py until it connects
    if conn is None or not conn.is_connected:
        raise redis.exceptions.ConnectionError("lock release notices: pub/sub connection lost")


__all__ = ["RedisReleaseNotifier", "ReleaseNotifier", "SharedReleaseNotifier"]
