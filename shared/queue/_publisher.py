"""Publishing queue events: split per shard, encode, XADD (pipelined), with bounded retries.

Delivery is at least once. A publish whose outcome is unknown (the
connection dropped or timed out after the commands were sent) is sent again
under the retry policy, so an event can land twice in a shard's stream, and
a batch retried after partial success can repeat its first entries. Workers
tolerate this: duplicate attempts and replayed job events are expected by
the contract. Within one publisher, the first copy of every event keeps its
order per shard.

The first publish of a publisher checks (or records) the fleet's shard
count in Redis, so a producer configured with the wrong N fails with
ConfigError instead of routing datasets to the wrong shards.

With a ``durability`` level other than ``memory`` (``redis.durability``,
see :mod:`._durability`) every pipelined batch ends with the level's ``WAIT``
/ ``WAITAOF`` on each node it wrote to; a batch that fell short is sent again
under the retry policy, so a returned publish is as durable as the level
says. The first publish also checks that the server gives the level at all
(a ConfigError, one line, when it cannot). ``wait_replicas`` /
``wait_timeout`` are the older spelling of ``durability`` = ``replicas``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import redis
import redis.asyncio

from .._errors import ConfigError
from .._retry import RetryPolicy, retry
from ..events import QueueEvent, entry_fields
from ..settings import Durability, RedisSettings, Secret, resolve_durability
from ._cluster import is_cluster
from ._connect import connect_sync, redis_errors
from ._durability import check_durability, check_durability_sync, check_durable, probe_keys, queue_durable
from ._fleet_meta import ensure_fleet, ensure_fleet_sync
from ._keys import Keys
from ._routing import split_by_shard

T = TypeVar("T")

DEFAULT_BATCH = 500

Fields = Mapping[str, bytes] | Mapping[bytes, bytes]
OnRetry = Callable[[int, BaseException], None]


SecretArg = bytes | str | Secret | None


def _secret_bytes(secret: SecretArg) -> bytes | None:
    if isinstance(secret, Secret):
        return secret.reveal_bytes()
    if secret is None or secret in ("", b""):
        return None
    return secret.encode("utf-8") if isinstance(secret, str) else secret


def plan_entries(
    evs: Iterable[QueueEvent],
    shards: int,
    *,
    secret: bytes | None = None,
    keys: Keys | None = None,
    ts_ms: int | None = None,
) -> list[tuple[int, dict[str, bytes]]]:
    """Return ``(shard, entry fields)`` for every stream entry the events become, in order.

    Pure (but for the clock when ``ts_ms`` is None): the routing and encoding
    shared by the async and sync publishers. With a ``secret``, entries are
    signed v2 for ``keys``' fleet and shard streams at ``ts_ms`` (now by
    default), or v1 when ``keys`` is None.
    """
    out: list[tuple[int, dict[str, bytes]]] = []
    if secret is not None and keys is not None and ts_ms is None:
        ts_ms = time.time_ns() // 1_000_000  # one clock read per batch
    for ev in evs:
        for shard, part in split_by_shard(ev, shards).items():
            if secret is None or keys is None:
                out.append((shard, entry_fields(part, secret=secret)))
            else:
                stream = keys.events(shard)
                signed = entry_fields(part, secret=secret, fleet=keys.fleet, stream=stream, ts_ms=ts_ms)
                out.append((shard, signed))
    return out


def _batches(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _xadd_args(maxlen: int | None) -> dict[str, Any]:
    return {} if maxlen is None else {"maxlen": maxlen, "approximate": True}


class _PublisherBase:
    """The routing and retry settings both publishers share."""

    def __init__(
        self,
        fleet: str,
        shards: int,
        secret: SecretArg,
        maxlen: int | None,
        policy: RetryPolicy | None,
        on_retry: OnRetry | None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        sign_version: int = 2,
        durability: Durability | None = None,
    ) -> None:
        if durability is None:
            try:
                durability = resolve_durability("", wait_replicas, wait_timeout)
            except ValueError:
                raise ConfigError(f"bad WAIT settings: {wait_replicas} replicas, {wait_timeout} s") from None
        self.durability = durability
        self.keys = Keys(fleet)
        self.shards = shards
        self.secret = _secret_bytes(secret)
        # v2 signs for this fleet's streams; v1 (data only) is for a fleet whose workers are older.
        self._sign_keys = self.keys if sign_version == 2 else None
        self.maxlen = maxlen
        self.policy = policy or RetryPolicy()
        self.on_retry = on_retry
        self._checked = False

    def _queue_waits(self, client: object, pipe: object, chunk: Sequence[tuple[int, Fields]]) -> int:
        """Append the durability waits of a batch to its pipeline; return how many (0 for ``memory``)."""
        if not self.durability.waits:
            return 0
        streams = {self.keys.events(shard) for shard, _ in chunk}
        return queue_durable(client, pipe, streams, self.durability)

    def _probe_keys(self) -> list[str]:
        return probe_keys(self.keys, self.shards)


class AsyncPublisher(_PublisherBase):
    """Publishes queue events to a fleet's shard streams (asyncio).

    ``secret`` turns on HMAC signing (``sig`` field, v2 unless
    ``sign_version=1``); ``maxlen`` caps each
    shard stream approximately (off by default: trimming can drop entries
    that were never consumed); ``policy`` bounds the retries of transient
    errors and ``on_retry(attempt, error)`` is called before each retry (for
    logs and metrics); ``durability`` (or the older ``wait_replicas`` /
    ``wait_timeout``): see the module docstring. The caller owns ``redis_client``.
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        fleet: str,
        shards: int,
        *,
        secret: SecretArg = None,
        maxlen: int | None = None,
        policy: RetryPolicy | None = None,
        on_retry: OnRetry | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        sign_version: int = 2,
        durability: Durability | None = None,
    ) -> None:
        self.redis = redis_client
        super().__init__(
            fleet,
            shards,
            secret,
            maxlen,
            policy,
            on_retry,
            wait_replicas,
            wait_timeout,
            sign_version,
            durability,
        )

    async def _check_fleet(self) -> None:
        if not self._checked:
            await retry(
                lambda: ensure_fleet(self.redis, self.keys.fleet, self.shards),
                self.policy,
                on_retry=self.on_retry,
            )
            await retry(
                lambda: check_durability(self.redis, self.durability, self._probe_keys()),
                self.policy,
                on_retry=self.on_retry,
            )
            self._checked = True

    async def publish(self, ev: QueueEvent) -> list[bytes]:
        """Publish one event: one XADD per shard it concerns, in one pipeline.

        Returns:
            The new stream ids, one per shard copy (in :func:`split_by_shard` order).

        Raises:
            TransientError: Redis stayed unreachable for the whole retry policy
                (the event may or may not have been written).
            ConfigError: the fleet has another shard count, or bad credentials.

        Cancellation: some copies may have been written; publishing again is safe.
        """
        return await self.publish_fields(
            plan_entries([ev], self.shards, secret=self.secret, keys=self._sign_keys)
        )

    async def publish_many(self, evs: Iterable[QueueEvent], *, batch: int = DEFAULT_BATCH) -> list[bytes]:
        """Publish events in pipelines of ``batch`` entries, keeping their order per shard.

        Returns the new stream ids in order. Raises and cancels as :meth:`publish`;
        batches before a failing one stay published.
        """
        return await self.publish_fields(
            plan_entries(evs, self.shards, secret=self.secret, keys=self._sign_keys), batch=batch
        )

    async def publish_fields(
        self, items: Sequence[tuple[int, Fields]], *, batch: int = DEFAULT_BATCH
    ) -> list[bytes]:
        """Raw layer: XADD ready-made entry fields to the given shards (pipelined batches, retried).

        Returns the new stream ids in order. Raises as :meth:`publish`.
        """
        await self._check_fleet()
        ids: list[bytes] = []
        extra = _xadd_args(self.maxlen)
        for chunk in _batches(items, batch):

            async def send(chunk: Sequence[tuple[int, Fields]] = chunk) -> list[bytes]:
                with redis_errors("XADD"):
                    if self.durability.waits and is_cluster(self.redis):
                        await self.redis.initialize()  # the slot map routes each WAIT
                    async with self.redis.pipeline(transaction=False) as pipe:
                        for shard, fields in chunk:
                            pipe.xadd(self.keys.events(shard), dict(fields), **extra)  # type: ignore[arg-type]
                        waits = self._queue_waits(self.redis, pipe, chunk)
                        return check_durable(
                            list(await pipe.execute()), waits, self.durability, client=self.redis
                        )

            ids.extend(await retry(send, self.policy, on_retry=self.on_retry))
        return ids


def retry_sync(fn: Callable[[], T], policy: RetryPolicy, *, on_retry: OnRetry | None = None) -> T:
    """Blocking twin of :func:`shared._retry.retry` (for code without an event loop).

    Returns what ``fn()`` returned; raises the last retryable error once the
    policy is spent, or any other error at once.
    """
    start = time.monotonic()
    delays = policy.delays()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except policy.retry_on as exc:
            delay = next(delays, None)
            if delay is None or time.monotonic() - start + delay > policy.budget:
                raise
            if on_retry is not None:
                on_retry(attempt, exc)
            time.sleep(delay)


class SyncPublisher(_PublisherBase):
    """Blocking publisher for Spark executors and scripts: same routing, encoding and retries.

    Create it once per process with :meth:`cached` (one connection pool per
    process, reused by every task); it is thread-safe. Arguments as
    :class:`AsyncPublisher`.
    """

    # The one deliberate piece of process-global state: Spark runs many tasks
    # in one Python worker and each would otherwise open its own connections.
    _cache: ClassVar[dict[tuple[Any, ...], SyncPublisher]] = {}
    _cache_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        redis_client: redis.Redis,
        fleet: str,
        shards: int,
        *,
        secret: SecretArg = None,
        maxlen: int | None = None,
        policy: RetryPolicy | None = None,
        on_retry: OnRetry | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        sign_version: int = 2,
        durability: Durability | None = None,
    ) -> None:
        self.redis = redis_client
        super().__init__(
            fleet,
            shards,
            secret,
            maxlen,
            policy,
            on_retry,
            wait_replicas,
            wait_timeout,
            sign_version,
            durability,
        )

    @classmethod
    def cached(
        cls,
        url: str,
        fleet: str,
        shards: int,
        secret: SecretArg = None,
        *,
        password: Secret | str = "",
        socket_timeout: float = 10.0,
        maxlen: int | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        sign_version: int = 2,
        durability: Durability | None = None,
        policy: RetryPolicy | None = None,
    ) -> SyncPublisher:
        """Return this process's publisher for these arguments, creating it on first use.

        Keyed by the process id too, so a forked child never reuses its
        parent's sockets. No I/O happens until the first publish.

        Raises:
            ConfigError: the URL is malformed.
        """
        pw = Secret(password)
        key = (
            os.getpid(),
            url,
            pw,
            fleet,
            shards,
            _secret_bytes(secret),
            socket_timeout,
            maxlen,
            sign_version,
            wait_replicas,
            wait_timeout,
            durability,
            policy,
        )
        with cls._cache_lock:
            found = cls._cache.get(key)
            if found is None:
                try:
                    settings = RedisSettings(url=url, password=pw, socket_timeout=socket_timeout)
                except ValueError as exc:
                    raise ConfigError(f"bad redis url: {exc}") from None
                client = connect_sync(settings, client_name=f"commitfleet-producer-{os.getpid()}")
                found = cls(
                    client,
                    fleet,
                    shards,
                    secret=secret,
                    maxlen=maxlen,
                    wait_replicas=wait_replicas,
                    wait_timeout=wait_timeout,
                    sign_version=sign_version,
                    durability=durability,
                    policy=policy,
                )
                cls._cache[key] = found
            return found

    @classmethod
    def close_cached(cls) -> None:
        """Close and forget every cached publisher of this process (tests, clean shutdown)."""
        with cls._cache_lock:
            publishers, cls._cache = list(cls._cache.values()), {}
        for pub in publishers:
            pub.close()

    def close(self) -> None:
        """Close the connection pool."""
        self.redis.close()

    def _check_fleet(self) -> None:
        if not self._checked:
            retry_sync(
                lambda: ensure_fleet_sync(self.redis, self.keys.fleet, self.shards),
                self.policy,
                on_retry=self.on_retry,
            )
            retry_sync(
                lambda: check_durability_sync(self.redis, self.durability, self._probe_keys()),
                self.policy,
                on_retry=self.on_retry,
            )
            self._checked = True

    def publish(self, ev: QueueEvent) -> list[bytes]:
        """Publish one event (see :meth:`AsyncPublisher.publish`); returns the new stream ids.

        Raises:
            TransientError: Redis stayed unreachable for the whole retry policy.
            ConfigError: the fleet has another shard count, or bad credentials.
        """
        return self.publish_fields(plan_entries([ev], self.shards, secret=self.secret, keys=self._sign_keys))

    def publish_many(self, evs: Iterable[QueueEvent], *, batch: int = DEFAULT_BATCH) -> list[bytes]:
        """Publish events in pipelined batches, order per shard kept; returns the new stream ids."""
        return self.publish_fields(
            plan_entries(evs, self.shards, secret=self.secret, keys=self._sign_keys), batch=batch
        )

    def publish_fields(
        self, items: Sequence[tuple[int, Fields]], *, batch: int = DEFAULT_BATCH
    ) -> list[bytes]:
        """Raw layer: XADD ready-made entry fields to the given shards; returns the new stream ids."""
        self._check_fleet()
        ids: list[bytes] = []
        extra = _xadd_args(self.maxlen)
        for chunk in _batches(items, batch):

            def send(chunk: Sequence[tuple[int, Fields]] = chunk) -> list[bytes]:
                with redis_errors("XADD"):
                    pipe = self.redis.pipeline(transaction=False)
                    for shard, fields in chunk:
                        pipe.xadd(self.keys.events(shard), dict(fields), **extra)  # type: ignore[arg-type]
                    waits = self._queue_waits(self.redis, pipe, chunk)
                    return check_durable(list(pipe.execute()), waits, self.durability, client=self.redis)

            ids.extend(retry_sync(send, self.policy, on_retry=self.on_retry))
        return ids


__all__ = ["DEFAULT_BATCH", "AsyncPublisher", "SyncPublisher", "plan_entries", "retry_sync"]
