"""A managed Redis's single-endpoint failover: the endpoint moves to the promoted replica, the old primary
lives on as a replica and answers READONLY on the connections opened before (shared/queue/_plain.py).

The endpoint is a loopback proxy switched from the old primary to the new one; the old primary is turned
into a replica of the new one (what the service does). After one failed try, the next goes to the new
primary, for the async client (the fleet) and the blocking one (Spark executors and tools), and the pool's
other idle connections are dropped with the first (no one fails again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis
import redis.asyncio

from shared import TransientError
from shared.queue import connect, connect_sync, redis_errors
from shared.settings import RedisSettings
from tests._support.redis_server import RedisServer
from tests._support.tcp_proxy import switchable_proxy

POOLED = 4


def _fail_over(old: RedisServer, new: RedisServer) -> None:
    """What the service does: the old primary becomes a replica of the promoted one."""
    with redis.Redis(port=old.port) as r:
        r.replicaof("127.0.0.1", str(new.port))


async def test_async_client_leaves_a_demoted_primary_behind_the_endpoint(
    redis_factory: Callable[..., RedisServer],
) -> None:
    old, new = redis_factory(), redis_factory()
    with switchable_proxy(old.port) as endpoint:
        client = connect(RedisSettings(url=f"redis://127.0.0.1:{endpoint.port}/0"))
        try:
            # Several pooled connections to the old primary, as a busy worker has.
            await asyncio.gather(*(client.set(f"k{i}", b"before") for i in range(POOLED)))
            assert len(client.connection_pool._available_connections) == POOLED  # type: ignore[attr-defined]
            _fail_over(old, new)
            endpoint.target = new.port
            with pytest.raises(TransientError, match="read-only"), redis_errors("SET"):
                await client.set("k0", b"after")
            # Every later try reaches the new primary: no pooled connection to the old one is left.
            await asyncio.gather(*(client.set(f"k{i}", b"after") for i in range(POOLED)))
            assert await client.xadd("s", {b"f": b"v"})
        finally:
            await client.aclose()
    with redis.Redis(port=new.port) as r:
        assert [r.get(f"k{i}") for i in range(POOLED)] == [b"after"] * POOLED
        assert r.xlen("s") == 1


def test_blocking_client_leaves_a_demoted_primary_behind_the_endpoint(
    redis_factory: Callable[..., RedisServer],
) -> None:
    old, new = redis_factory(), redis_factory()
    with switchable_proxy(old.port) as endpoint:
        client = connect_sync(RedisSettings(url=f"redis://127.0.0.1:{endpoint.port}/0"))
        try:
            client.set("k", b"before")
            _fail_over(old, new)
            endpoint.target = new.port
            with pytest.raises(TransientError, match="read-only"), redis_errors("SET"):
                client.set("k", b"after")
            client.set("k", b"after")
            with client.pipeline(transaction=True) as pipe:
                pipe.set("p", b"1").incr("n")
                pipe.execute()
        finally:
            client.close()
    with redis.Redis(port=new.port) as r:
        assert (r.get("k"), r.get("p"), r.get("n")) == (b"after", b"1", b"1")
