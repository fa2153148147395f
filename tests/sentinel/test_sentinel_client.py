"""The Sentinel client on a demoted master: READONLY and NOREPLICAS are transient, and the retry reaches
the master the Sentinels name now.

Two plain redis-servers, B a replica of A, and the clients ``connect`` and
``connect_sync`` return for a ``redis+sentinel://`` URL, whose Sentinels are
played by a stub naming whichever address the test sets: first B (a master
that was demoted while the client held connections to it, or a Sentinel that
has not heard of the failover yet), then A. A real Sentinel closes the
clients of a master it demotes (``CLIENT KILL TYPE normal``), so the fleet
tests of ``make redis-ha`` rarely meet READONLY: this is where it is met.

The same stub shows a durability shortfall (``WAIT 1`` answering 0 on a master
whose replica is frozen, while the Sentinels name another master) making the
publishers' retry ask the Sentinels again, async and sync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio

from shared import RetryPolicy, TransientError
from shared.events import JobStarted
from shared.queue import AsyncPublisher, Keys, SyncPublisher, connect, connect_sync, redis_errors, shard_of
from shared.settings import Durability, RedisSettings
from tests._support.ports import free_port
from tests._support.redis_server import RedisServer, wait_replica_synced
from tests._support.wait import wait_for, wait_for_sync


class StubSentinels:
    """Names ``address`` as the master; closes the real (unreachable) Sentinels' clients when closed."""

    def __init__(self, real: Any, address: tuple[str, int]) -> None:
        self.real = real
        self.address = address
        self.asked = 0

    def _discover(self) -> tuple[str, int]:
        self.asked += 1
        return self.address

    async def aclose(self) -> None:
        await self.real.aclose()

    def close(self) -> None:
        self.real.close()


class AsyncStub(StubSentinels):
    async def discover_master(self, service_name: str) -> tuple[str, int]:
        return self._discover()


class SyncStub(StubSentinels):
    def discover_master(self, service_name: str) -> tuple[str, int]:
        return self._discover()


def _pair(redis_factory: Callable[..., RedisServer]) -> tuple[RedisServer, RedisServer]:
    a = redis_factory(extra_args=["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"])
    b = redis_factory(extra_args=["--replicaof", "127.0.0.1", str(a.port)])

    def synced() -> bool:
        r = redis.Redis(port=b.port)
        try:
            return r.info("replication").get("master_link_status") == "up"
        finally:
            r.close()

    wait_for_sync(synced, timeout=15, what="the replica to sync")
    return a, b


def _settings() -> RedisSettings:
    return RedisSettings(url=f"redis+sentinel://127.0.0.1:{free_port()}/svc", socket_timeout=2.0)


async def _attempt(what: str, call: Callable[[], Any]) -> Any:
    with redis_errors(what):
        return await call()


async def test_readonly_from_a_demoted_master_is_transient_and_the_retry_reaches_the_new_one(
    redis_factory: Callable[..., RedisServer],
) -> None:
    a, b = _pair(redis_factory)
    client = connect(_settings())
    pool: Any = client.connection_pool
    stub = AsyncStub(pool.sentinel_manager, ("127.0.0.1", b.port))
    pool.sentinel_manager = stub
    try:
        # Connections opened while B was the master (reads still work there).
        await asyncio.gather(*(client.get("k") for _ in range(3)))
        assert len(pool._available_connections) == 3
        stub.address = ("127.0.0.1", a.port)  # the failover: A is the master now

        # One write meets READONLY on a connection to B: transient, that connection dropped.
        with pytest.raises(TransientError, match="previous master is now a slave"):
            await _attempt("SET", lambda: client.set("k", b"1"))
        # The retry asks the Sentinels, finds A, and the pool drops its other connections to B.
        assert await _attempt("SET", lambda: client.set("k", b"1"))
        live = [c for c in pool._available_connections if c.is_connected]
        assert live and all(c.port == a.port for c in live), [(c.port, c.is_connected) for c in live]
        for _ in range(5):  # every later command reaches A at once
            assert await _attempt("INCR", lambda: client.incr("n"))

        # A transaction and a script on B are refused the same way.
        for call in (
            lambda: client.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, "k", "2"),
            lambda: client.pipeline(transaction=True).set("k", "3").incr("n").execute(),
            lambda: client.pipeline(transaction=False).set("k", "4").incr("n").execute(),
        ):
            stub.address = ("127.0.0.1", b.port)
            pool.master_address = None
            await pool.disconnect()  # reconnect to B
            with pytest.raises(TransientError, match="previous master is now a slave"):
                await _attempt("write", call)
            stub.address = ("127.0.0.1", a.port)
            assert await _attempt("write", call)

        # A master that lost its replicas under min-replicas-to-write refuses writes (NOREPLICAS): the
        # connection is dropped and the Sentinels asked again, as for READONLY.
        await client.config_set("min-replicas-to-write", 2)
        asked = stub.asked
        with pytest.raises(TransientError, match="no longer a usable master"):
            await _attempt("SET", lambda: client.set("k", b"5"))
        await client.config_set("min-replicas-to-write", 0)
        assert await _attempt("SET", lambda: client.set("k", b"5"))
        assert stub.asked > asked
        replica = redis.Redis(port=b.port)
        try:
            wait_for_sync(lambda: replica.get("k") == b"5", timeout=10, what="the write replicated to B")
        finally:
            replica.close()
    finally:
        await client.aclose()


def test_the_sync_client_too(redis_factory: Callable[..., RedisServer]) -> None:
    a, b = _pair(redis_factory)
    client = connect_sync(_settings())
    pool: Any = client.connection_pool
    stub = SyncStub(pool.sentinel_manager, ("127.0.0.1", b.port))
    pool.sentinel_manager = pool.proxy.sentinel_manager = stub
    try:
        assert client.get("k") is None
        stub.address = ("127.0.0.1", a.port)
        with pytest.raises(TransientError, match="previous master is now a slave"), redis_errors("SET"):
            client.set("k", b"1")
        with redis_errors("SET"):
            assert client.set("k", b"1")
        pipe = client.pipeline(transaction=True)
        with redis_errors("MULTI"):
            assert pipe.set("k", b"2").incr("n").execute() == [True, 1]
    finally:
        client.close()


async def test_a_blocked_read_ended_by_a_demotion_is_transient_and_drops_the_connection(
    redis_factory: Callable[..., RedisServer],
) -> None:
    a = redis_factory()
    elsewhere = redis_factory()
    client = connect(_settings())
    pool: Any = client.connection_pool
    pool.sentinel_manager = AsyncStub(pool.sentinel_manager, ("127.0.0.1", a.port))
    try:
        await client.xgroup_create("s", "g", id="0", mkstream=True)
        reading = asyncio.ensure_future(
            _attempt("XREADGROUP", lambda: client.xreadgroup("g", "c", {"s": ">"}, block=10_000))
        )
        admin = redis.asyncio.Redis(port=a.port)
        try:

            async def blocked() -> bool:
                return int((await admin.info("clients"))["blocked_clients"]) == 1

            await wait_for(blocked, timeout=10, what="the read to block")
            await admin.replicaof("127.0.0.1", elsewhere.port)  # the master is demoted under the blocked read
        finally:
            await admin.aclose()
        with pytest.raises(TransientError, match=r"no longer a usable master.*UNBLOCKED"):
            await reading
        assert not any(c.is_connected for c in pool._available_connections)
    finally:
        await client.aclose()


async def test_a_timeout_drops_the_idle_connections_to_a_frozen_master(
    redis_factory: Callable[..., RedisServer],
) -> None:
    """redis-py keeps a pool's idle connections to a master until a new connection finds another master:
    one of them used late in a freeze would wait for the frozen master and take its answer when it is
    thawed (a write the demoted master then throws away). One timeout drops them all here."""
    a = redis_factory()
    settings = RedisSettings(url=f"redis+sentinel://127.0.0.1:{free_port()}/svc", socket_timeout=0.5)
    client = connect(settings)
    pool: Any = client.connection_pool
    pool.sentinel_manager = AsyncStub(pool.sentinel_manager, ("127.0.0.1", a.port))
    try:
        await asyncio.gather(*(client.get("k") for _ in range(3)))
        assert sum(c.is_connected for c in pool._available_connections) == 3
        a.freeze()
        try:
            with pytest.raises(TransientError, match="Timeout"):
                await _attempt("GET", lambda: client.get("k"))
            assert not any(c.is_connected for c in pool._available_connections)
        finally:
            a.thaw()
        assert await _attempt("SET", lambda: client.set("k", b"1"))
    finally:
        await client.aclose()


def test_the_sync_client_drops_its_idle_connections_too(redis_factory: Callable[..., RedisServer]) -> None:
    a = redis_factory()
    client = connect_sync(
        RedisSettings(url=f"redis+sentinel://127.0.0.1:{free_port()}/svc", socket_timeout=0.5)
    )
    pool: Any = client.connection_pool
    pool.sentinel_manager = pool.proxy.sentinel_manager = SyncStub(
        pool.sentinel_manager, ("127.0.0.1", a.port)
    )
    try:
        held = [pool.get_connection() for _ in range(3)]
        for c in held:
            pool.release(c)
        assert sum(c._sock is not None for c in pool._available_connections) == 3
        a.freeze()
        try:
            with pytest.raises(TransientError, match="Timeout"), redis_errors("GET"):
                client.get("k")
            assert all(c._sock is None for c in pool._available_connections)
        finally:
            a.thaw()
        with redis_errors("SET"):
            assert client.set("k", b"1")
    finally:
        client.close()


def _two_masters(redis_factory: Callable[..., RedisServer]) -> tuple[RedisServer, RedisServer, RedisServer]:
    """Return (A, A's replica, B): B a master with its own replica, as after a failover to it."""
    a = redis_factory()
    a_replica = redis_factory(replica_of=a)
    b = redis_factory()
    b_replica = redis_factory(replica_of=b)
    wait_replica_synced(a, a_replica)
    wait_replica_synced(b, b_replica)
    return a, a_replica, b


def _stream(port: int, key: str) -> list[str]:
    r = redis.Redis(port=port)
    try:
        return [msgspec.json.decode(f[b"data"])["job"] for _id, f in r.xrange(key)]
    finally:
        r.close()


SHORT = RetryPolicy(attempts=4, initial=0.01, maximum=0.05, budget=20.0)
REPLICAS = Durability("replicas", 1, 0.3)


def _started(job: str) -> JobStarted:
    return JobStarted(job=job, datasets=["orders"], timeout_s=60, started_at=1.0)


async def test_a_durability_shortfall_makes_the_retry_ask_the_sentinels(
    redis_factory: Callable[..., RedisServer], fleet_name: str
) -> None:
    """A master that still answers but lost its replicas (a partition; the Sentinels promoted B meanwhile):
    ``WAIT 1`` answers 0 there, a transient error, and the retry must reach B, not the same pooled
    connection to A (where every retry would fall short again until the budget ran out)."""
    a, a_replica, b = _two_masters(redis_factory)
    client = connect(_settings())
    pool: Any = client.connection_pool
    stub = AsyncStub(pool.sentinel_manager, ("127.0.0.1", a.port))
    pool.sentinel_manager = stub
    shortfalls: list[BaseException] = []
    pub = AsyncPublisher(
        client, fleet_name, 4, durability=REPLICAS, policy=SHORT, on_retry=lambda _n, e: shortfalls.append(e)
    )
    stream = Keys(fleet_name).events(shard_of("orders", 4))
    try:
        await pub.publish(_started("before"))  # the start-up check and a publish, on A
        a_replica.freeze()  # A is cut off from its replica
        stub.address = ("127.0.0.1", b.port)  # and the Sentinels name B
        await pub.publish(_started("after"))
        assert [str(e) for e in shortfalls] == [
            "durability replicas (1): only 0 of 1 replicas acknowledged the writes in 0.3 s"
        ]
        assert _stream(b.port, stream) == ["after"]
        live = [c for c in pool._available_connections if c.is_connected]
        assert live and all(c.port == b.port for c in live), [(c.port, c.is_connected) for c in live]
    finally:
        a_replica.thaw()
        await client.aclose()


def test_the_sync_publisher_too(redis_factory: Callable[..., RedisServer], fleet_name: str) -> None:
    a, a_replica, b = _two_masters(redis_factory)
    client = connect_sync(_settings())
    pool: Any = client.connection_pool
    stub = SyncStub(pool.sentinel_manager, ("127.0.0.1", a.port))
    pool.sentinel_manager = pool.proxy.sentinel_manager = stub
    pub = SyncPublisher(client, fleet_name, 4, durability=REPLICAS, policy=SHORT)
    stream = Keys(fleet_name).events(shard_of("orders", 4))
    try:
        pub.publish(_started("before"))
        a_replica.freeze()
        stub.address = ("127.0.0.1", b.port)
        asked = stub.asked
        pub.publish(_started("after"))
        assert stub.asked > asked
        assert _stream(b.port, stream) == ["after"]
    finally:
        a_replica.thaw()
        client.close()
