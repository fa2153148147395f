"""The Redis Streams layer when Redis fails: killed, restarted, slow, or refusing our credentials."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import redis.exceptions

from shared import ConfigError, RetryPolicy, TransientError, retry
from shared.events import StagedFile, TaskFinished, ValidationLimits, decode_entry
from shared.queue import AsyncPublisher, Keys, ShardConsumer, connect, ensure_fleet, redis_errors, shard_of
from shared.settings import RedisSettings
from tests._support.redis_server import RedisServer
from tests._support.wait import wait_for

SHARDS = 2
LIMITS = ValidationLimits()


def task(index: int, dataset: str = "orders") -> TaskFinished:
    return TaskFinished(
        job="job-1",
        dataset=dataset,
        task=index,
        attempt=0,
        files=[StagedFile(path="f.parquet", size=index)],
        finished_at=1.0,
    )


SHARD = shard_of("orders", SHARDS)


async def test_publisher_retries_through_a_redis_kill_and_restart(
    redis_factory: Callable[..., RedisServer], fleet_name: str
) -> None:
    server = redis_factory(persistent=True)
    client = connect(RedisSettings(url=server.url, socket_timeout=2.0))
    try:
        keys = Keys(fleet_name)
        pub = AsyncPublisher(client, fleet_name, SHARDS, policy=RetryPolicy(attempts=2).no_wait())
        reader = ShardConsumer(client, keys, SHARD, consumer="w1")
        await reader.ensure_group()
        await pub.publish_many([task(i) for i in range(3)])

        server.kill()
        # Translated at the boundary, and bounded: a short policy gives up with TransientError.
        with pytest.raises(TransientError):
            await pub.publish(task(99))
        with pytest.raises(TransientError):
            await reader.read(10, 10)

        retries: list[BaseException] = []
        patient = AsyncPublisher(
            client,
            fleet_name,
            SHARDS,
            policy=RetryPolicy(attempts=200, initial=0.02, maximum=0.1, budget=60),
            on_retry=lambda _n, exc: retries.append(exc),
        )
        publishing = asyncio.create_task(patient.publish_many([task(i) for i in range(3, 6)]))

        async def retried() -> bool:
            return len(retries) >= 2

        await wait_for(retried, what="the publisher to retry while Redis is down")
        assert not publishing.done()
        await asyncio.to_thread(server.start)
        async with asyncio.timeout(30):
            ids = await publishing
        assert len(ids) == 3
        assert all(isinstance(exc, TransientError) for exc in retries)

        # appendfsync always: everything acknowledged before the kill survived, and the
        # consumer group too. A retried publish may legally duplicate entries, so
        # compare the distinct tasks in order.
        got = [decode_entry(e.fields, limits=LIMITS) for e in await reader.read(100, 10)]
        tasks = [ev.task for ev in got if isinstance(ev, TaskFinished)]
        assert list(dict.fromkeys(tasks)) == [0, 1, 2, 3, 4, 5]
    finally:
        await client.aclose()


async def test_consumer_survives_redis_losing_its_data(
    redis_factory: Callable[..., RedisServer], fleet_name: str
) -> None:
    server = redis_factory(persistent=False)
    client = connect(RedisSettings(url=server.url, socket_timeout=2.0))
    try:
        keys = Keys(fleet_name)
        reader = ShardConsumer(client, keys, SHARD, consumer="w1")
        await reader.ensure_group()
        await client.xadd(keys.events(SHARD), {b"data": b"{}"})
        assert len(await reader.read(10, 10)) == 1

        server.restart()  # no persistence: stream and group are gone
        # The pooled connection is stale: the first command may fail as TransientError,
        # which a worker retries; then NOGROUP re-creates the group.
        policy = RetryPolicy(attempts=5).no_wait()
        assert await retry(lambda: reader.read(10, 10), policy) == []
        await client.xadd(keys.events(SHARD), {b"data": b"{}"})
        assert len(await reader.read(10, 10)) == 1
    finally:
        await client.aclose()


async def test_a_read_whose_reply_was_lost_is_returned_by_the_next_read(
    redis_factory: Callable[..., RedisServer], fleet_name: str
) -> None:
    server = redis_factory(extra_args=["--enable-debug-command", "yes"])
    client = connect(RedisSettings(url=server.url, socket_timeout=0.3))
    try:
        keys = Keys(fleet_name)
        reader = ShardConsumer(client, keys, SHARD, consumer="w1")
        await reader.ensure_group()
        for _ in range(3):
            await client.xadd(keys.events(SHARD), {b"data": b"{}"})

        # Freeze the server for 1.5 s from a raw socket, and make sure it is frozen.
        sleeper = socket.create_connection(("127.0.0.1", server.port))
        sleeper.sendall(b"DEBUG SLEEP 1.5\r\n")
        probe = connect(RedisSettings(url=server.url, socket_timeout=0.1))

        async def frozen() -> bool:
            try:
                await probe.ping()
            except redis.exceptions.RedisError:
                return True
            return False

        try:
            await wait_for(frozen, what="redis to freeze")
            # Sent, but the reply comes too late: the entries become pending to us unseen.
            with pytest.raises(TransientError):
                await reader.read(10, 10)
            assert sleeper.recv(16).startswith(b"+OK")
        finally:
            sleeper.close()
            await probe.aclose()
        pending = await client.xpending(keys.events(SHARD), "workers")
        assert pending["pending"] == 3
        assert len(await reader.read(10, 10)) == 3  # the lost ones, at once
        assert await reader.read(10, 10) == []
    finally:
        await client.aclose()


async def test_bad_credentials_are_a_config_error_and_acl_users_work(
    redis_factory: Callable[..., RedisServer], fleet_name: str
) -> None:
    server = redis_factory(
        extra_args=["--requirepass", "right", "--user", "alice", "on", ">pw", "~cf:*", "&*", "+@all"]
    )
    port = server.port
    wrong = connect(RedisSettings(url=f"redis://:wrong@127.0.0.1:{port}/0"))
    alice_wrong = connect(RedisSettings(url=f"redis://alice:nope@127.0.0.1:{port}/0"))
    alice = connect(RedisSettings(url=f"redis://alice:pw@127.0.0.1:{port}/0"))
    try:
        with pytest.raises(ConfigError, match="credentials"):
            await ensure_fleet(wrong, fleet_name, 4)
        with pytest.raises(ConfigError, match="credentials"):
            await ensure_fleet(alice_wrong, fleet_name, 4)
        assert await ensure_fleet(alice, fleet_name, 4) == 4
        with pytest.raises(ConfigError, match="ACL"), redis_errors("SET"):  # alice: only cf:* keys
            await alice.set("elsewhere", b"x")
    finally:
        for c in (wrong, alice_wrong, alice):
            await c.aclose()


def test_a_bad_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        connect(RedisSettings(url="redis://127.0.0.1:notaport/0"))


def test_sync_publisher_gives_up_with_transient_error_and_recovers(
    redis_factory: Callable[..., RedisServer], fleet_name: str
) -> None:
    import redis as sync_redis

    from shared.queue import SyncPublisher, connect_sync

    server = redis_factory()
    retried: list[int] = []
    pub = SyncPublisher(
        connect_sync(RedisSettings(url=server.url, socket_timeout=2.0)),
        fleet_name,
        SHARDS,
        policy=RetryPolicy(attempts=3).no_wait(),
        on_retry=lambda n, _exc: retried.append(n),
    )
    try:
        assert len(pub.publish(task(0))) == 1
        server.kill()
        with pytest.raises(TransientError):
            pub.publish(task(1))
        assert retried == [1, 2]
        server.start()
        assert len(pub.publish(task(2))) == 1
        check = sync_redis.Redis.from_url(server.url)
        try:
            assert check.xlen(Keys(fleet_name).events(SHARD)) == 1  # not persistent: only the new one
        finally:
            check.close()
    finally:
        pub.close()
