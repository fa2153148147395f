"""Connecting to Redis by URL, and translating redis-py errors into ours.

``redis://[user[:password]@]host:port/db``, ``rediss://...`` (TLS; query options
such as ``ssl_ca_certs=/path`` or ``ssl_cert_reqs=none`` are passed to
redis-py) and ``unix:///path.sock?db=0`` are accepted. Clients return bytes
(``decode_responses=False``). The password comes from ``RedisSettings.password``
(the settings moved any password out of the URL), so neither the URL nor any
error message built from it holds one.

``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://`` with TLS)
gives a redis-py ``RedisCluster`` client (see :mod:`._cluster`). It is typed
as the plain client: it offers the same commands, pipelines, transactions
(one slot, see Keys) and scripts, and callers need not know which they hold.

``redis+sentinel://host:port[,host:port...]/SERVICE[/db]`` (``rediss+sentinel://``
with TLS) gives a client of the master that the Sentinels name, found again
after a failover (see :mod:`._sentinel`).

redis-py's own retry loop is switched off: retries happen in one place, our
:class:`~shared._retry.RetryPolicy`, where callers can see them (a consumer
must know that a read was lost, see ShardConsumer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.exceptions as rx
import redis.retry

from .._errors import ConfigError, NotFound, Throttled, TransientError
from .._redis_py import is_redis_failure
from ..settings import RedisSettings, is_cluster_url, is_sentinel_url
from ._cluster import connect_cluster, connect_cluster_sync
from ._plain import AsyncPool, SyncPool
from ._sentinel import connect_sentinel, connect_sentinel_sync
from ._stream_replies import keep_repeated_fields

# A pooled connection idle longer than this is PINGed before use, so a Redis
# restart shows up as one reconnect instead of an error on the next command.
HEALTH_CHECK_INTERVAL = 15


def connect(settings: RedisSettings, *, client_name: str | None = None) -> redis.asyncio.Redis:
    """Return an asyncio Redis client for ``settings.url`` (no I/O yet: connects lazily).

    The caller owns the client and closes it with ``await client.aclose()``.
    It reads stream entries through :func:`keep_repeated_fields`.

    Raises:
        ConfigError: the URL cannot be parsed.
    """
    if is_cluster_url(settings.url):
        return keep_repeated_fields(
            connect_cluster(settings, client_name=client_name, health_check_interval=HEALTH_CHECK_INTERVAL)
        )
    if is_sentinel_url(settings.url):
        return keep_repeated_fields(
            connect_sentinel(settings, client_name=client_name, health_check_interval=HEALTH_CHECK_INTERVAL)
        )
    try:
        # A pool whose connections let go of a demoted master (a managed service's DNS failover: ._plain).
        pool = AsyncPool.from_url(
            settings.url,
            password=settings.password.reveal() or None,
            retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
            decode_responses=False,
            socket_timeout=settings.socket_timeout,
            socket_connect_timeout=settings.socket_timeout,
            socket_keepalive=True,
            health_check_interval=HEALTH_CHECK_INTERVAL,
            client_name=client_name or None,
        )
    except ValueError as exc:
        raise ConfigError(f"bad redis.url: {exc}") from None
    client = redis.asyncio.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # closed with the client, as redis-py's from_url does
    return keep_repeated_fields(client)


def connect_sync(settings: RedisSettings, *, client_name: str | None = None) -> redis.Redis:
    """Return a blocking Redis client for ``settings.url`` (for Spark executors and tools).

    A cluster client learns the cluster's layout at once (the only client
    here that does I/O when created). A single-node client reads stream
    entries through :func:`keep_repeated_fields`; a cluster one (redis-py's
    blocking ``RedisCluster`` parses replies on each node's own client) is
    for writes: :func:`~._entry.entries_from_reply` refuses what it reads.

    Raises:
        ConfigError: the URL cannot be parsed.
        TransientError: (cluster URL) no seed node answered.
    """
    if is_cluster_url(settings.url):
        with redis_errors("connect to the cluster"):
            return connect_cluster_sync(
                settings, client_name=client_name, health_check_interval=HEALTH_CHECK_INTERVAL
            )
    if is_sentinel_url(settings.url):
        return keep_repeated_fields(
            connect_sentinel_sync(
                settings, client_name=client_name, health_check_interval=HEALTH_CHECK_INTERVAL
            )
        )
    try:
        sync_pool = SyncPool.from_url(
            settings.url,
            password=settings.password.reveal() or None,
            retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
            decode_responses=False,
            socket_timeout=settings.socket_timeout,
            socket_connect_timeout=settings.socket_timeout,
            socket_keepalive=True,
            health_check_interval=HEALTH_CHECK_INTERVAL,
            client_name=client_name or None,
        )
    except ValueError as exc:
        raise ConfigError(f"bad redis.url: {exc}") from None
    client = redis.Redis(connection_pool=sync_pool)
    client.auto_close_connection_pool = True
    return keep_repeated_fields(client)


# redis-py's RedisClusterException texts that mean "the cluster is not reachable or not settled".
_CLUSTER_TRANSIENT = ("cannot be connected", "could not agree", "are not covered", "No targets were found")


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Translate redis-py exceptions raised inside the block into commitfleet's tree.

    Works around sync and async code alike (``with redis_errors("XADD"): await ...``).

    - authentication / ACL failures (wrong password, NOPERM, a command an ACL denies
      inside a script) -> ConfigError
    - connection errors, timeouts, LOADING, TRYAGAIN, CLUSTERDOWN, MOVED / ASK
      left over after redis-py's redirects, a slot not covered, a cluster not
      reachable, READONLY (failover in progress), no master known to the
      Sentinels (an election), NOREPLICAS, MISCONF, redis-py tripping
      over a connection closed under it or over its cluster slot map
      (an AttributeError or LookupError raised inside redis-py) -> TransientError
    - OOM -> Throttled
    - NOGROUP, "no such key", UNBLOCKED because the key was deleted -> NotFound
    - UNBLOCKED for any other reason (the server became a replica) -> TransientError
    - WRONGTYPE (a key used by something else) -> ConfigError
    - WAITAOF refused (appendonly turned off, a server older than 7.2) -> ConfigError

    Other ``ResponseError``s, and an AttributeError or LookupError raised by our
    own code, are programming errors and propagate unchanged.
    CancelledError is never touched.
    """
    try:
        yield
    except (rx.AuthenticationError, rx.AuthorizationError, rx.AuthenticationWrongNumberOfArgsError) as exc:
        raise ConfigError(f"redis refused our credentials during {what}: {_message(exc)}") from exc
    except rx.NoPermissionError as exc:
        raise ConfigError(f"redis ACL denies {what}: {_message(exc)}") from exc
    except (rx.ConnectionError, rx.TimeoutError, rx.TryAgainError, rx.ClusterDownError) as exc:
        raise TransientError(f"redis unavailable during {what}: {_message(exc)}") from exc
    except (rx.AskError, rx.ClusterError, rx.SlotNotCoveredError) as exc:
        raise TransientError(f"redis cluster is moving during {what}: {_message(exc)}") from exc
    except rx.RedisClusterException as exc:
        # Only the cluster being out of reach or resharding is transient; "same key
        # slot", "missing key" and the like are programming errors and propagate.
        text = _message(exc)
        if "Cluster mode is not enabled" in text:
            raise ConfigError(f"redis.url names a cluster but the server is not one ({what})") from exc
        if any(s in text for s in _CLUSTER_TRANSIENT):
            raise TransientError(f"redis cluster unavailable during {what}: {text}") from exc
        raise
    except rx.ReadOnlyError as exc:
        raise TransientError(f"redis is a read-only replica during {what}: {_message(exc)}") from exc
    except rx.OutOfMemoryError as exc:
        raise Throttled(f"redis is out of memory during {what}: {_message(exc)}") from exc
    except AttributeError as exc:
        # redis-py's own code can trip over a connection closed under it (seen on a
        # cluster failover: its writer set to None mid-send); ours propagates as a bug.
        if not is_redis_failure(exc):
            raise
        raise TransientError(f"redis client lost its connection during {what}: {exc}") from exc
    except LookupError as exc:
        # redis-py's cluster client can look a slot up in a slot map that is empty or being
        # rebuilt (KeyError inside redis-py); ours (a KeyError in our code) propagates as a bug.
        if not is_redis_failure(exc):
            raise
        raise TransientError(f"redis cluster client's slot map is changing during {what}: {exc!r}") from exc
    except rx.ResponseError as exc:
        text = _message(exc)
        if text.startswith("NOGROUP") or "no such key" in text.lower():
            raise NotFound(f"{what}: {text}") from exc
        if text.startswith("UNBLOCKED"):
            # A blocked XREADGROUP ended by Redis: its key was deleted (FLUSHALL, DEL: the
            # stream is gone, like NOGROUP), or the server stopped being a master (failover).
            if "no longer exists" in text:
                raise NotFound(f"{what}: {text}") from exc
            raise TransientError(f"redis ended a blocked {what}: {text}") from exc
        if text.startswith(("MISCONF", "LOADING", "MASTERDOWN", "NOREPLICAS")):
            raise TransientError(f"redis cannot serve {what} now: {text}") from exc
        if text.startswith("WRONGTYPE"):
            raise ConfigError(f"{what}: a key has the wrong type (another program uses it?): {text}") from exc
        if text.startswith(("NOAUTH", "WRONGPASS")):
            raise ConfigError(f"redis refused our credentials during {what}: {text}") from exc
        if text.startswith("NOPERM") or "can't run this command" in text:
            # A command an ACL denies inside a script (EVAL / EVALSHA) comes as a plain error
            # naming the script, not as NOPERM: the same configuration problem.
            raise ConfigError(f"redis ACL denies {what}: {text}") from exc
        if "waitaof" in text.lower():
            # Checked at start (redis.durability); seen later only when the server changed under
            # us: appendonly turned off, or a failover to a node older than Redis 7.2.
            raise ConfigError(f"redis can no longer give redis.durability during {what}: {text}") from exc
        raise


__all__ = ["HEALTH_CHECK_INTERVAL", "connect", "connect_sync", "redis_errors"]
