"""The quick Sentinel check of the default run: a real master + 2 replicas + 3 Sentinels, no failover.

A coordinator and a worker (in-process) commit a small job published through
a ``redis+sentinel://`` URL; the executors' cached sync publisher, the CLI's
status and WAIT go through it too. The data nodes have a password, the
Sentinels none (the common shape): the URL's password goes to the master
only. A misconfigured URL (credentials the Sentinels refuse, a service they do
not know, a wrong password) is a ConfigError at the first command, not a
transient error retried until the budget runs out. The failovers are in
``make redis-ha`` (tests/fleet/test_fleet_sentinel.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.admin import get_status
from shared import ConfigError, TransientError
from shared.events import Committed, JobStarted
from shared.queue import AsyncPublisher, SyncPublisher, connect, connect_sync, ensure_fleet, redis_errors
from shared.settings import RedisSettings, masked_url
from shared.spark import ProducerConfig
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, clean_audit, committed, no_wal_left
from tests._support.fleet_jobs import good_job
from tests._support.redis_sentinel import SERVICE, LocalSentinelGroup, SentinelServer
from tests._support.wait import wait_for

PASSWORD = "m4ster-pw#1"


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinelGroup]:
    """One group for the module (no test here fails it over): data nodes with a password."""
    g = LocalSentinelGroup(tmp_path_factory.mktemp("sentinel-smoke"), password=PASSWORD)
    try:
        g.start()
        yield g
    finally:
        g.stop()


def with_password(url: str, password: str = PASSWORD) -> str:
    return url.replace("redis+sentinel://", f"redis+sentinel://:{password}@")


async def test_publish_and_commit_through_sentinel(
    group: LocalSentinelGroup, fleet_name: str, tmp_path: Path
) -> None:
    url = with_password(group.url)
    settings = fleet_settings(url, tmp_path / "store", fleet_name, shards=4)
    assert PASSWORD not in settings.redis.url and PASSWORD not in masked_url(url)
    client = connect(settings.redis)
    try:
        async with inprocess_fleet(client, settings, ensure=False) as fleet:
            await ensure_fleet(client, fleet_name, 4)
            datasets = [f"ds{i}" for i in range(4)]
            pub = AsyncPublisher(client, fleet_name, 4, wait_replicas=2)  # both replicas acknowledge
            await pub.publish_many(await good_job(fleet.store, "job-ok", datasets, tasks=2))
            await wait_for(lambda: committed(fleet.store, datasets, "job-ok"), timeout=30, what="commits")

            async def four_committed() -> bool:
                return sum(isinstance(e, Committed) for e in await admin_events(client, fleet_name)) == 4

            await wait_for(four_committed, timeout=20, what="4 committed events")
            await wait_for(lambda: no_wal_left(fleet.store), timeout=20, what="commit sequences finished")
            assert (await clean_audit(fleet.store)).ok
            status = await get_status(settings)  # the CLI's status, through the Sentinels
            assert status["fleet"] == fleet_name, status

            # The executors' publisher: the URL (and its password) as a ProducerConfig carries it.
            producer = ProducerConfig.from_settings(settings)
            assert producer.redis_url.startswith("redis+sentinel://") and producer.redis_password
            sync = SyncPublisher.cached(
                producer.redis_url, fleet_name, 4, password=producer.redis_password, wait_replicas=1
            )
            try:
                ev = JobStarted(job="j2", datasets=["x"], timeout_s=60, started_at=time.time())
                assert len(await asyncio.to_thread(sync.publish, ev)) == 1
            finally:
                SyncPublisher.close_cached()
    finally:
        await client.aclose()
    # The master is the node the Sentinels name: what was written is there.
    assert group.role(group.master()) == "master"


async def _first_command(url: str, password: str = "") -> None:
    client = connect(RedisSettings(url=url, password=password, socket_timeout=2.0))
    try:
        with redis_errors("PING"):
            await client.ping()
    finally:
        await client.aclose()


async def test_a_misconfigured_sentinel_url_is_a_config_error_at_once(group: LocalSentinelGroup) -> None:
    started = time.monotonic()
    # The Sentinels have no password and no ACL user "app": they refuse "app"'s credentials.
    app = group.url.replace("redis+sentinel://", f"redis+sentinel://app:{PASSWORD}@")
    with pytest.raises(ConfigError, match="Sentinels refused our credentials") as err:
        await _first_command(app + "?sentinel_auth=same")
    assert PASSWORD not in str(err.value) and "\n" not in str(err.value)
    # A password alone is accepted by a Sentinel that has none (redis-py lets "no password is set" pass).
    await _first_command(with_password(group.url) + "?sentinel_auth=same")
    with pytest.raises(ConfigError, match="no Sentinel knows the master group 'nosuch'"):
        await _first_command(with_password(group.url.replace(f"/{SERVICE}", "/nosuch")))
    with pytest.raises(ConfigError, match="refused our credentials"):
        await _first_command(group.url, password="wrong")
    with pytest.raises(ConfigError, match="refused our credentials"):
        await _first_command(group.url)  # the master wants a password: NOAUTH
    # A Sentinel with a password of its own (here the master's): asked without one, it refuses;
    # with ?sentinel_auth=same it gets the URL's credentials and names the master.
    locked = SentinelServer(
        group.workdir / "sentinel-locked",
        monitor_port=group.master().port,
        auth_pass=PASSWORD,
        requirepass=PASSWORD,
    )
    locked.start()
    try:
        url = f"redis+sentinel://127.0.0.1:{locked.port}/{SERVICE}"
        with pytest.raises(ConfigError, match=r"\?sentinel_auth=same"):
            await _first_command(with_password(url))
        await _first_command(with_password(url) + "?sentinel_auth=same")
    finally:
        locked.stop()
    # The recommended shape: one ACL user on the data nodes and the Sentinels, where all the fleet asks a
    # Sentinel for is SENTINEL MASTERS.
    master = group.node(group.master().port)
    try:
        master.acl_setuser("app", enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+@all"])
    finally:
        master.close()
    acl = SentinelServer(
        group.workdir / "sentinel-acl",
        monitor_port=group.master().port,
        auth_pass=PASSWORD,
        conf=["user default off", f"user app on >{PASSWORD} -@all +sentinel|masters"],
    )
    acl.start()
    try:
        url = f"redis+sentinel://app:{PASSWORD}@127.0.0.1:{acl.port}/{SERVICE}"
        with pytest.raises(ConfigError, match=r"\?sentinel_auth=same"):
            await _first_command(url)
        await _first_command(url + "?sentinel_auth=same")
    finally:
        acl.stop()
    assert time.monotonic() - started < 10, "a configuration error must not wait for a retry budget"


def test_sync_client_and_unreachable_sentinels(group: LocalSentinelGroup) -> None:
    client = connect_sync(RedisSettings(url=with_password(group.url)))
    try:
        with redis_errors("SET"):
            assert client.set("k", b"v") and client.get("k") == b"v"
    finally:
        client.close()
    # No Sentinel answers: a transient error (a network problem or the Sentinels restarting).
    dead = connect_sync(
        RedisSettings(url=f"redis+sentinel://127.0.0.1:1,127.0.0.1:2/{SERVICE}", socket_timeout=0.5)
    )
    try:
        with pytest.raises(TransientError, match="no master found"), redis_errors("PING"):
            dead.ping()
    finally:
        dead.close()


def test_the_spark_preflight_reports_a_sentinel_problem_as_one_line(group: LocalSentinelGroup) -> None:
    from shared.spark._preflight import _check_redis

    good = ProducerConfig(redis_url=with_password(group.url), store_url="file:///nowhere", shards=4)
    assert _check_redis(good) == []
    unknown = ProducerConfig(
        redis_url=with_password(group.url.replace(f"/{SERVICE}", "/nosuch")), store_url="file:///x", shards=4
    )
    [line] = _check_redis(unknown)
    assert "no Sentinel knows the master group 'nosuch'" in line and PASSWORD not in line
