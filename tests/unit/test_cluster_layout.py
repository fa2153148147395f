"""The Redis Cluster key layout and URL form: one slot per shard, one fleet slot, bad URLs refused."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from shared import ConfigError, load_settings
from shared.queue import Keys, connect
from shared.settings import RedisSettings, parse_cluster_url


def test_every_fleet_wide_key_shares_the_admin_stream_slot() -> None:
    keys = Keys("prod-1")
    fleet_keys = [
        keys.admin,
        keys.workers,
        keys.outcome_counts,
        keys.outcome_marker("ds", "job"),
        *(keys.fleet_key(n) for n in ("assignment", "handoff", "leader", "metrics", "worker.w-1")),
    ]
    assert {key_slot(k.encode()) for k in fleet_keys} == {keys.fleet_slot}
    assert Keys.one_slot(fleet_keys) == fleet_keys


def test_fleets_land_on_different_slots() -> None:
    slots = {Keys(f"fleet{i}").fleet_slot for i in range(50)}
    assert len(slots) > 40  # spread over the cluster, not one hot slot for every fleet


def test_the_shard_keys_share_one_slot_per_shard() -> None:
    keys = Keys("f")
    for shard in (0, 7, 4095):
        names = [
            keys.events(shard),
            keys.dead(shard),
            keys.shard_state(shard, "owner"),
            keys.shard_state(shard, "jobs"),
            keys.job_alive(shard, "j1"),
            keys.job_result(shard, "j1"),
        ]
        assert Keys.one_slot(names) == names


def test_one_slot_refuses_keys_of_two_slots() -> None:
    keys = Keys("f")
    with pytest.raises(ValueError, match="2 cluster slots"):
        Keys.one_slot([keys.events(0), keys.events(1)])
    with pytest.raises(ValueError, match="cluster slots"):
        Keys.one_slot([keys.meta, keys.workers])  # meta stays untagged: single-key use only


def test_cluster_url_parts() -> None:
    url = parse_cluster_url(
        "rediss+cluster://u:p%40ss@10.0.0.1:7000,node-b:7001,[::1]:7002/0?ssl_ca_certs=/ca.pem"
    )
    assert url.nodes == (("10.0.0.1", 7000), ("node-b", 7001), ("::1", 7002))
    assert url.tls and url.username == "u" and url.password == "p@ss"
    assert url.options == (("ssl_ca_certs", "/ca.pem"),)
    assert not parse_cluster_url("redis+cluster://h:1").tls


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://", "bad cluster seed"),
        ("redis+cluster://host", "bad cluster seed"),
        ("redis+cluster://h:1,,h:2", "bad cluster seed"),
        ("redis+cluster://h:99999", "bad port"),
        ("redis+cluster://h:1/3", "only database 0"),
        ("redis+cluster://h:1?db=2", "unknown cluster url option"),
        ("redis-cluster://h:1", "must start with"),
    ],
)
def test_a_wrong_redis_url_stops_the_settings_with_one_line(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        load_settings(env={}, overrides={"redis": {"url": url}})
    assert "\n" not in str(err.value)


def test_a_cluster_password_reaches_the_cluster_client() -> None:
    """The settings move a URL's password into redis.password: the client must still get it."""
    for settings in (
        RedisSettings(url="redis+cluster://u:pw%23@h:1,h:2"),
        RedisSettings(url="redis+cluster://u@h:1", password="pw#"),
    ):
        client = connect(settings)  # no I/O: never connected, nothing to close
        kwargs = client.nodes_manager.connection_kwargs  # type: ignore[attr-defined]
        assert (kwargs["username"], kwargs["password"]) == ("u", "pw#")


def test_wait_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="wait_replicas"):
        load_settings(env={}, overrides={"redis": {"wait_replicas": -1}})
    s = load_settings(env={}, overrides={"redis": {"url": "redis+cluster://h:1", "wait_replicas": 1}})
    assert s.redis.wait_replicas == 1
