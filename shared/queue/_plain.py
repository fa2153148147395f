"""Clients of a plain ``redis://`` / ``rediss://`` / ``unix://`` URL that let go of a demoted master.

A managed Redis with one endpoint (ElastiCache's primary endpoint, Memorystore's
IP) fails over by moving the endpoint's DNS name or address to the promoted
replica; the old primary often lives on as a replica. A connection opened
before the move still reaches it, and it answers every write with ``READONLY``
(a blocked read ends with ``UNBLOCKED``). redis-py keeps such a connection (only
its Sentinel client drops one), so every retry took the same pooled connection
to the old primary until the caller's budget ran out.

Here a connection that meets either reply disconnects itself and the pool's
idle connections (they lead to the same old primary) before the error goes
up, unchanged: the caller's retry opens a new connection, which resolves the
endpoint again. The errors stay what they were (``redis_errors`` makes them
``TransientError``); only the connections are dropped.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection as aconn
import redis.connection as sconn
import redis.exceptions as rx


def demoted(exc: rx.ResponseError) -> bool:
    """Return True when ``exc`` says the server is no longer a master: ``READONLY``, or a blocked
    read ended because it became a replica (``UNBLOCKED``, not the key's deletion)."""
    if isinstance(exc, rx.ReadOnlyError):
        return True
    text = str(exc)
    return text.startswith("READONLY") or (text.startswith("UNBLOCKED") and "no longer exists" not in text)


class _AsyncDrop:
    """What an async connection of :class:`AsyncPool` does when its server was demoted (one per pool)."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        self._pool = weakref.ref(pool)

    async def __call__(self, conn: aconn.AbstractConnection) -> None:
        await conn.disconnect()
        pool = self._pool()
        if pool is not None:
            with contextlib.suppress(rx.RedisError, OSError):
                await pool.disconnect(inuse_connections=False)


async def _async_read(
    read: Callable[..., Any], drop: _AsyncDrop | None, conn: aconn.AbstractConnection, *a: Any, **k: Any
) -> Any:
    try:
        return await read(*a, **k)
    except rx.ResponseError as exc:
        if drop is not None and demoted(exc):
            await drop(conn)
        raise


class _AsyncTcp(aconn.Connection):
    drop: _AsyncDrop | None = None

    async def read_response(self, *a: Any, **k: Any) -> Any:
        return await _async_read(super().read_response, self.drop, self, *a, **k)


class _AsyncTls(aconn.SSLConnection):
    drop: _AsyncDrop | None = None

    async def read_response(self, *a: Any, **k: Any) -> Any:
        return await _async_read(super().read_response, self.drop, self, *a, **k)


class _AsyncUnix(aconn.UnixDomainSocketConnection):
    drop: _AsyncDrop | None = None

    async def read_response(self, *a: Any, **k: Any) -> Any:
        return await _async_read(super().read_response, self.drop, self, *a, **k)


_ASYNC: dict[type[Any], type[Any]] = {
    aconn.Connection: _AsyncTcp,
    aconn.SSLConnection: _AsyncTls,
    aconn.UnixDomainSocketConnection: _AsyncUnix,
}


class AsyncPool(redis.asyncio.ConnectionPool):
    """redis-py's pool for a plain URL whose connections let go of a demoted master (module doc)."""

    def __init__(self, connection_class: type[Any] = aconn.Connection, **kwargs: Any) -> None:
        super().__init__(connection_class=_ASYNC.get(connection_class, connection_class), **kwargs)
        self._drop = _AsyncDrop(self)

    def make_connection(self) -> Any:
        conn = super().make_connection()  # type: ignore[no-untyped-call]
        if isinstance(conn, _AsyncTcp | _AsyncTls | _AsyncUnix):
            conn.drop = self._drop
        return conn


class _SyncDrop:
    """The blocking twin of :class:`_AsyncDrop`."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = weakref.ref(pool)

    def __call__(self, conn: sconn.AbstractConnection) -> None:
        conn.disconnect()  # type: ignore[no-untyped-call]
        pool = self._pool()
        if pool is not None:
            with contextlib.suppress(rx.RedisError, OSError):
                pool.disconnect(inuse_connections=False)


def _sync_read(
    read: Callable[..., Any], drop: _SyncDrop | None, conn: sconn.AbstractConnection, *a: Any, **k: Any
) -> Any:
    try:
        return read(*a, **k)
    except rx.ResponseError as exc:
        if drop is not None and demoted(exc):
            drop(conn)
        raise


class _SyncTcp(sconn.Connection):
    drop: _SyncDrop | None = None

    def read_response(self, *a: Any, **k: Any) -> Any:
        return _sync_read(super().read_response, self.drop, self, *a, **k)


class _SyncTls(sconn.SSLConnection):
    drop: _SyncDrop | None = None

    def read_response(self, *a: Any, **k: Any) -> Any:
        return _sync_read(super().read_response, self.drop, self, *a, **k)


class _SyncUnix(sconn.UnixDomainSocketConnection):
    drop: _SyncDrop | None = None

    def read_response(self, *a: Any, **k: Any) -> Any:
        return _sync_read(super().read_response, self.drop, self, *a, **k)


_SYNC: dict[type[Any], type[Any]] = {
    sconn.Connection: _SyncTcp,
    sconn.SSLConnection: _SyncTls,
    sconn.UnixDomainSocketConnection: _SyncUnix,
}


class SyncPool(redis.ConnectionPool):
    """The blocking twin of :class:`AsyncPool`."""

    def __init__(self, connection_class: type[Any] = sconn.Connection, **kwargs: Any) -> None:
        super().__init__(connection_class=_SYNC.get(connection_class, connection_class), **kwargs)
        self._drop = _SyncDrop(self)

    def make_connection(self) -> Any:
        conn = super().make_connection()
        if isinstance(conn, _SyncTcp | _SyncTls | _SyncUnix):
            conn.drop = self._drop
        return conn


__all__ = ["AsyncPool", "SyncPool", "demoted"]
