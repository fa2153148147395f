"""A master found through Redis Sentinel: redis-py's Sentinel clients, closed and judged our way.

A ``redis+sentinel://host:port[,host:port...]/SERVICE[/db]`` URL (see
:mod:`shared.settings`) gives a client of redis-py's ``master_for(SERVICE)``:
every new connection asks the Sentinels where the master is, so after a
failover the next connection reaches the promoted replica. What redis-py
does on a failover, and what we rely on (redis-py 8.1):

- a connection lost or timed out is dropped; the next one asks again (a
  Sentinel that still names the dead master gives a refused connection, or,
  once the master is down in its eyes, no master at all: ``MasterNotFoundError``,
  a ``ConnectionError``). Both are TransientErrors at the boundary. Here the
  pool's idle connections are dropped with it (redis-py keeps them until a new
  connection finds a new master address): an idle connection to a frozen
  master, used late in the freeze, would otherwise take the answer the old
  master gives once thawed, for a write it throws away when it is demoted;
- ``READONLY`` from a demoted master (a connection opened before the
  failover) makes redis-py drop that connection and raise ``ConnectionError``
  (a single command, a pipeline and a transaction alike), so the retry asks
  the Sentinels again; a new master address drops every idle connection of
  the pool, so the stale ones do not each fail once more;
- ``NOREPLICAS`` (a master configured with ``min-replicas-to-write`` that lost
  its replicas: an old master back from a freeze, not yet demoted) and
  ``UNBLOCKED`` for a blocked read the server ended because it became a
  replica are treated the same way here: the connection is dropped and the
  retry asks the Sentinels;
- a ``WAIT`` / ``WAITAOF`` that falls short of ``redis.durability`` (a master
  cut off from its replicas: partitioned, or back from a freeze and not yet
  demoted, still answering as a master) is a TransientError like the others,
  but nothing in its reply tells the connection so: :func:`rediscover`, called
  by :func:`~shared.queue._durability.check_durable`, makes the pool drop its
  idle connections before it hands out the next one, so the retry asks the
  Sentinels, which name the promoted replica once they have failed over.

Like the other clients, redis-py's own retry loop is off: retries happen in
our RetryPolicy. The Sentinels' own clients (one per Sentinel) are closed with
the master client's pool.

Errors redis-py would report as "No master found" for ever, and so as a
transient error retried until the budget runs out, are configuration errors
here, raised at once: every Sentinel that answered refused our credentials
(a Sentinel with ``requirepass`` asked without ``?sentinel_auth=same``, or the
other way round), or none of them knows the service name.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.exceptions as rx
import redis.retry
import redis.sentinel

from .._errors import ConfigError
from ..settings import RedisSettings, SentinelUrl, parse_sentinel_url


def _parts(
    settings: RedisSettings, client_name: str | None, health_check_interval: int
) -> tuple[SentinelUrl, dict[str, Any], dict[str, Any]]:
    """Return the parsed URL, the master connections' kwargs and the Sentinels' kwargs (no retry)."""
    try:
        url = parse_sentinel_url(settings.url)
    except ValueError as exc:
        raise ConfigError(f"bad redis.url: {exc}") from None
    password = settings.password.reveal() or url.password or None
    tls: dict[str, Any] = {}
    if url.tls:
        tls["ssl"] = True
        for name, value in url.options:
            tls[name] = value.lower() not in ("0", "false", "no") if name == "ssl_check_hostname" else value
    common = {
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        "socket_keepalive": True,
    }
    master = {
        **common,
        **tls,
        "db": url.db,
        "username": url.username,
        "password": password,
        "decode_responses": False,
        "health_check_interval": health_check_interval,
        "client_name": client_name or None,
    }
    sentinels = {**common, **tls}
    if url.sentinel_auth:
        sentinels |= {"username": url.username, "password": password}
    return url, master, sentinels


class _Judge:
    """What the Sentinels said when none named a usable master: transient, or a configuration error."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.unreachable: list[str] = []
        self.refused: list[str] = []
        self.unknown: list[str] = []
        self.answered = 0

    def failed(self, where: str, exc: Exception) -> None:
        if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError):
            self.refused.append(f"{where}: {exc}")
        else:
            self.unreachable.append(f"{where}: {exc!r}")

    def masters(self, where: str, masters: dict[str, Any]) -> dict[str, Any] | None:
        """Return the service's state from one Sentinel's SENTINEL MASTERS reply, if it knows it."""
        self.answered += 1
        state = masters.get(self.service)
        if state is None:
            self.unknown.append(f"{where} knows {sorted(masters)[:10]}")
        return state

    def give_up(self) -> Exception:
        """Return the error to raise: a ConfigError, an AuthenticationError or MasterNotFoundError."""
        if self.refused and not self.answered:
            hint = "the URL's user:password go to the Sentinels only with ?sentinel_auth=same"
            return rx.AuthenticationError(
                f"the Sentinels refused our credentials ({hint}): {'; '.join(self.refused)}"
            )
        if self.answered and len(self.unknown) == self.answered:
            return ConfigError(
                f"redis.url: no Sentinel knows the master group {self.service!r}: {'; '.join(self.unknown)}"
            )
        detail = "; ".join(self.unreachable) or "the master is down or being replaced"
        return redis.sentinel.MasterNotFoundError(f"no master found for {self.service!r}: {detail}")


def _address(sentinel: Any) -> str:
    kw = sentinel.connection_pool.connection_kwargs
    return f"sentinel {kw.get('host')}:{kw.get('port')}"


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    """redis-py's asyncio Sentinel, telling a configuration error from an election (see _Judge)."""

    async def discover_master(self, service_name: str) -> Any:
        judge = _Judge(service_name)
        for i, sentinel in enumerate(self.sentinels):
            try:
                masters: Any = await sentinel.sentinel_masters()
            except (rx.ConnectionError, rx.TimeoutError, rx.NoPermissionError) as exc:
                judge.failed(_address(sentinel), exc)
                continue
            state = judge.masters(_address(sentinel), masters)
            if state and self.check_master_state(state, service_name):
                self.sentinels[0], self.sentinels[i] = sentinel, self.sentinels[0]
                return state["ip"], state["port"]
        raise judge.give_up()


class _SyncSentinel(redis.sentinel.Sentinel):
    """redis-py's blocking Sentinel, telling a configuration error from an election (see _Judge)."""

    def discover_master(self, service_name: str) -> Any:
        judge = _Judge(service_name)
        for i, sentinel in enumerate(self.sentinels):
            try:
                masters: Any = sentinel.sentinel_masters()
            except (rx.ConnectionError, rx.TimeoutError, rx.NoPermissionError) as exc:
                judge.failed(_address(sentinel), exc)
                continue
            state = judge.masters(_address(sentinel), masters)
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                self.sentinels[0], self.sentinels[i] = sentinel, self.sentinels[0]
                return state["ip"], state["port"]
        raise judge.give_up()


def _demoted(exc: rx.ResponseError) -> bool:
    """NOREPLICAS, or a blocked read ended because the server stopped being the master (UNBLOCKED)."""
    text = str(exc)
    return text.startswith("NOREPLICAS") or (text.startswith("UNBLOCKED") and "no longer exists" not in text)


class _AsyncConnection(redis.asyncio.sentinel.SentinelManagedConnection):
    """A master connection that treats NOREPLICAS and UNBLOCKED (the server became a replica) as redis-py
    treats READONLY: drop it, ask the Sentinels again.

    A connection lost or timed out (READONLY included) drops the pool's idle
    connections too: they lead to the same master, which may be dead or
    frozen, and one of them used late in a freeze would take the answer of
    the old master once it is thawed, for a write it is about to throw away
    when the Sentinels demote it.
    """

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except rx.ResponseError as exc:
            if not _demoted(exc):
                raise
            await self.disconnect()
            await self.connection_pool.disconnect(inuse_connections=False)
            raise rx.ConnectionError(f"no longer a usable master ({exc}): asking the Sentinels") from exc
        except (rx.ConnectionError, rx.TimeoutError):
            with contextlib.suppress(rx.RedisError, OSError):
                await self.connection_pool.disconnect(inuse_connections=False)
            raise


class _AsyncSSLConnection(_AsyncConnection, redis.asyncio.connection.SSLConnection):
    pass


class _SyncConnection(redis.sentinel.SentinelManagedConnection):
    """The blocking twin of :class:`_AsyncConnection`."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except rx.ResponseError as exc:
            if not _demoted(exc):
                raise
            self.disconnect()  # type: ignore[no-untyped-call]
            self._drop_idle()
            raise rx.ConnectionError(f"no longer a usable master ({exc}): asking the Sentinels") from exc
        except (rx.ConnectionError, rx.TimeoutError):
            self._drop_idle()
            raise

    def _drop_idle(self) -> None:
        pool = self.connection_pool.connection_pool_ref()  # redis-py's proxy holds the pool weakly
        if pool is not None:
            with contextlib.suppress(rx.RedisError, OSError):
                pool.disconnect(inuse_connections=False)


class _SyncSSLConnection(_SyncConnection, redis.connection.SSLConnection):
    pass


class _AsyncPool(redis.asyncio.sentinel.SentinelConnectionPool):
    """The master's pool; closing it closes the Sentinels' clients too (redis-py leaves them open).

    With ``stale`` set (:func:`rediscover`) the next ``get_connection`` first
    drops the idle connections, so the one it hands out asks the Sentinels.
    """

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        kwargs["connection_class"] = _AsyncSSLConnection if kwargs.pop("ssl", False) else _AsyncConnection
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self.stale = False

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.stale:
            self.stale = False
            with contextlib.suppress(rx.RedisError, OSError):
                await self.disconnect(inuse_connections=False)
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.sentinel_manager.aclose()


class _SyncPool(redis.sentinel.SentinelConnectionPool):
    """The blocking twin of :class:`_AsyncPool`."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        kwargs["connection_class"] = _SyncSSLConnection if kwargs.pop("ssl", False) else _SyncConnection
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self.stale = False

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self.stale:
            self.stale = False
            with contextlib.suppress(rx.RedisError, OSError):
                self.disconnect(inuse_connections=False)
        return super().get_connection(*args, **kwargs)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.sentinel_manager.close()


def rediscover(client: object) -> None:
    """Make a Sentinel client's next command ask the Sentinels where the master is (no I/O here).

    For a master that answers but can no longer give what was asked of it (a
    durability wait that fell short): the pool drops its idle connections
    before it hands out the next one. A connection in use now is left alone
    (its own errors drop it). Nothing for any other client.
    """
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, _AsyncPool | _SyncPool):
        pool.stale = True


def connect_sentinel(
    settings: RedisSettings, *, client_name: str | None, health_check_interval: int
) -> redis.asyncio.Redis:
    """Return an asyncio client of the master a Sentinel URL names (no I/O yet: it asks on first use).

    Raises ConfigError for a bad URL.
    """
    url, master, sentinels = _parts(settings, client_name, health_check_interval)
    no_retry = redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0)
    manager: Any = _AsyncSentinel(  # type: ignore[no-untyped-call]
        list(url.sentinels), sentinel_kwargs={**sentinels, "retry": no_retry}
    )
    client = manager.master_for(url.service, connection_pool_class=_AsyncPool, retry=no_retry, **master)
    return cast(redis.asyncio.Redis, client)


def connect_sentinel_sync(
    settings: RedisSettings, *, client_name: str | None, health_check_interval: int
) -> redis.Redis:
    """Return a blocking client of the master a Sentinel URL names (no I/O yet).

    Raises ConfigError for a bad URL.
    """
    url, master, sentinels = _parts(settings, client_name, health_check_interval)
    no_retry = redis.retry.Retry(redis.backoff.NoBackoff(), 0)
    manager: Any = _SyncSentinel(  # type: ignore[no-untyped-call]
        list(url.sentinels), sentinel_kwargs={**sentinels, "retry": no_retry}
    )
    client = manager.master_for(url.service, connection_pool_class=_SyncPool, retry=no_retry, **master)
    return cast(redis.Redis, client)


__all__ = ["connect_sentinel", "connect_sentinel_sync", "rediscover"]
