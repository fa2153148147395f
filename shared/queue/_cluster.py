"""Redis Cluster clients and the WAIT-for-replicas step of publishers.

A ``redis+cluster://`` URL (see :mod:`shared.settings`) gives redis-py's
``RedisCluster``. Like the single-node clients, its own retry loop is off
(``Retry(NoBackoff(), 0)``): a connection error marks the slot map stale
and surfaces at once as TransientError, and our RetryPolicy retries on the
refreshed map. MOVED / ASK redirects are followed by redis-py within one
call (its redirection limit); what is left over is a TransientError too.

WAIT: replication is asynchronous, so an acknowledged write can be lost when
its master fails before a replica copied it. With ``redis.wait_replicas`` =
N > 0, a publisher's pipeline ends with ``WAIT N timeout`` on every node it
wrote to, on the same connection as the writes (WAIT counts that
connection's writes only), and fewer than N acknowledgements is a
TransientError: the batch is sent again (duplicates are expected by the
contract), so no acknowledged publish depends on one node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.exceptions as rx
import redis.retry

from .._errors import ConfigError, TransientError
from ..settings import RedisSettings, parse_cluster_url


def _cluster_kwargs(
    settings: RedisSettings, client_name: str | None, health_check_interval: int
) -> dict[str, Any]:
    try:
        url = parse_cluster_url(settings.url)
    except ValueError as exc:
        raise ConfigError(f"bad redis.url: {exc}") from None
    kwargs: dict[str, Any] = {
        "username": url.username,
        # The settings moved a URL's password into settings.password: the URL no longer holds it.
        "password": settings.password.reveal() or url.password or None,
        "decode_responses": False,
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        "socket_keepalive": True,
        "health_check_interval": health_check_interval,
        "client_name": client_name or None,
        "ssl": url.tls,
    }
    for name, value in url.options:
        kwargs[name] = value.lower() not in ("0", "false", "no") if name == "ssl_check_hostname" else value
    kwargs["_nodes"] = url.nodes
    return kwargs


# Errors after which the slot map may be stale (a master died, a failover is under way).
_STALE_MAP = (rx.ConnectionError, rx.TimeoutError, rx.ClusterDownError, rx.SlotNotCoveredError)


class _Pipeline(redis.asyncio.cluster.ClusterPipeline):
    """A cluster pipeline that marks the slot map stale after a connection error.

    redis-py's single commands do that themselves (the next call re-reads the
    map, finding a promoted replica); its pipelines only do it inside their
    own retry loop, which is off here, so without this every retry of ours
    would go to the dead master again.
    """

    def _mark_stale(self, exc: BaseException | None) -> None:
        if isinstance(exc, _STALE_MAP):
            self.cluster_client._initialize = True

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error=raise_on_error, allow_redirections=allow_redirections)
        except _STALE_MAP as exc:
            self._mark_stale(exc)
            raise

    async def watch(self, *names: Any) -> Any:  # type: ignore[override]
        # Re-read a stale slot map here, on our event loop: see execute_command.
        if self.cluster_client._initialize:
            await self.cluster_client.initialize()
        return await super().watch(*names)  # type: ignore[no-untyped-call]

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        # redis-py 8.1 runs a transaction's commands through asyncio.run() in a
        # thread, and re-reads a stale slot map there: on connections that belong
        # to our loop ("attached to a different loop", a crash). Keep the map as
        # it is for that call: a stale map then fails as a transient error, marks
        # itself stale again, and the next try's WATCH re-reads it here.
        strategy = getattr(self, "_execution_strategy", None)
        if (
            isinstance(strategy, redis.asyncio.cluster.TransactionStrategy)
            and self.cluster_client._initialize
        ):
            self.cluster_client._initialize = False
            try:
                return super().execute_command(*args, **kwargs)
            finally:
                self.cluster_client._initialize = True
        return super().execute_command(*args, **kwargs)

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # Covers WATCH / GET run at once inside a transaction block, too.
        self._mark_stale(exc_value)
        await super().__aexit__(exc_type, exc_value, traceback)


class _Cluster(redis.asyncio.cluster.RedisCluster):
    """redis-py's asyncio RedisCluster with :class:`_Pipeline` pipelines."""

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> _Pipeline:
        if shard_hint:
            raise ValueError("shard_hint is not supported on a cluster")
        return _Pipeline(self, transaction)  # type: ignore[abstract]  # redis-py builds it the same way


def connect_cluster(
    settings: RedisSettings, *, client_name: str | None, health_check_interval: int
) -> redis.asyncio.Redis:
    """Return an asyncio RedisCluster client for a cluster URL (no I/O yet: it learns the slots lazily).

    Typed as the plain client (same command API). Raises ConfigError for a bad URL.
    """
    kwargs = _cluster_kwargs(settings, client_name, health_check_interval)
    nodes = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in kwargs.pop("_nodes")]
    client = _Cluster(
        startup_nodes=nodes, retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0), **kwargs
    )
    return cast(redis.asyncio.Redis, client)


def connect_cluster_sync(
    settings: RedisSettings, *, client_name: str | None, health_check_interval: int
) -> redis.Redis:
    """Return a blocking RedisCluster client for a cluster URL (it reads the slot map now).

    Raises ConfigError for a bad URL; redis-py's errors when no seed answers
    (the caller translates them, see ``redis_errors``).
    """
    kwargs = _cluster_kwargs(settings, client_name, health_check_interval)
    nodes = [
        redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
        for host, port in kwargs.pop("_nodes")
    ]
    client = redis.cluster.RedisCluster(
        startup_nodes=nodes, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0), **kwargs
    )
    return cast(redis.Redis, client)


def is_cluster(client: object) -> bool:
    """Return True when ``client`` (or pipeline) talks to a Redis Cluster."""
    return isinstance(
        client,
        (
            redis.asyncio.cluster.RedisCluster,
            redis.cluster.RedisCluster,
            redis.asyncio.cluster.ClusterPipeline,
            redis.cluster.ClusterPipeline,
        ),
    )


def queue_wait(client: Any, pipe: Any, keys: Iterable[str], replicas: int, timeout: float) -> int:
    """Append ``WAIT replicas timeout`` to a non-transactional pipeline, once per node written to.

    ``keys`` are the keys the pipeline writes. On one node that is one WAIT
    at the end; on a cluster one WAIT per master owning any of the keys,
    routed to that master, so it runs on the connection that carried the
    writes. Returns how many WAIT replies the pipeline's result ends with.
    An async cluster client must have read its slot map (``await
    client.initialize()``) before this is called.
    """
    ms = max(1, int(timeout * 1000))
    if not is_cluster(client):
        pipe.execute_command("WAIT", replicas, ms)
        return 1
    nodes = {}
    for key in keys:
        node = client.get_node_from_key(key)
        if node is None:
            raise TransientError(f"redis cluster: no master known for {key!r} (slot map not loaded)")
        nodes[node.name] = node
    for node in nodes.values():
        pipe.execute_command("WAIT", replicas, ms, target_nodes=node)
    return len(nodes)


async def wait_replicated(client: redis.asyncio.Redis, key: str, replicas: int, wait_s: float) -> None:
    """Wait until ``replicas`` replicas hold every write made so far to the master serving ``key``.

    For writes made on another pooled connection (a WATCH/MULTI/EXEC that
    has already returned): WAIT counts the writes of its own connection,
    but the replication stream is one ordered log per master, so one more
    write (``SET key 1``, ``key`` a small marker in the written slot) then
    WAIT on its connection covers everything the master applied before.

    Raises:
        TransientError: fewer acknowledgements within ``wait_s`` seconds (the writes
            stand on the master; the caller may save again, idempotently).
    """
    if is_cluster(client):
        await client.initialize()
    async with client.pipeline(transaction=False) as pipe:
        pipe.set(key, b"1")
        waits = queue_wait(client, pipe, [key], replicas, wait_s)
        check_waits(list(await pipe.execute()), waits, replicas)


def check_waits(replies: list[Any], waits: int, replicas: int) -> list[Any]:
    """Return ``replies`` without their last ``waits`` WAIT replies, after checking them.

    Raises:
        TransientError: a WAIT saw fewer than ``replicas`` acknowledgements (the
            writes exist on their master but may be lost in a failover: the
            caller sends them again).
    """
    if waits == 0:
        return replies
    body, acks = replies[:-waits], replies[-waits:]
    short = [int(a) for a in acks if int(a) < replicas]
    if short:
        raise TransientError(
            f"only {min(short)} of {replicas} replicas acknowledged the writes (WAIT timed out)"
        )
    return body


__all__ = [
    "check_waits",
    "connect_cluster",
    "connect_cluster_sync",
    "is_cluster",
    "queue_wait",
    "wait_replicated",
]
