"""Redis Cluster clients.

A ``redis+cluster://`` URL (see :mod:`shared.settings`) gives redis-py's
``RedisCluster``. Like the single-node clients, its own retry loop is off
(``Retry(NoBackoff(), 0)``): a connection error marks the slot map stale
and surfaces at once as TransientError, and our RetryPolicy retries on the
refreshed map. MOVED / ASK redirects are followed by redis-py within one
call (its redirection limit); what is left over is a TransientError too.

The durability step after writes (``WAIT`` / ``WAITAOF`` per node written
to) is :mod:`._durability`'s.
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.exceptions as rx
import redis.retry

from .._errors import ConfigError
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


__all__ = [
    "connect_cluster",
    "connect_cluster_sync",
    "is_cluster",
]
