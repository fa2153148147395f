"""``redis.durability`` and its alias ``redis.wait_replicas``: the levels, the rules that combine them."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from shared import ConfigError, load_settings
from shared.settings import Durability, RedisSettings, resolve_durability
from shared.spark import ProducerConfig


def durable(env: dict[str, str]) -> Durability:
    return load_settings(env=env).redis.durable


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, Durability("memory", 0, 1.0)),
        ({"COMMITFLEET_REDIS_DURABILITY": "memory"}, Durability("memory", 0, 1.0)),
        ({"COMMITFLEET_REDIS_DURABILITY": "replicas"}, Durability("replicas", 1, 1.0)),
        (
            {"COMMITFLEET_REDIS_DURABILITY": "replicas", "COMMITFLEET_REDIS_WAIT_REPLICAS": "2"},
            Durability("replicas", 2, 1.0),
        ),
        ({"COMMITFLEET_REDIS_DURABILITY": "aof"}, Durability("aof", 0, 1.0)),
        ({"COMMITFLEET_REDIS_DURABILITY": "aof+replicas"}, Durability("aof+replicas", 1, 1.0)),
        (
            {
                "COMMITFLEET_REDIS_DURABILITY": "aof+replicas",
                "COMMITFLEET_REDIS_WAIT_REPLICAS": "3",
                "COMMITFLEET_REDIS_WAIT_TIMEOUT": "2.5",
            },
            Durability("aof+replicas", 3, 2.5),
        ),
        # The alias: wait_replicas alone means "replicas", as it did before the setting existed.
        ({"COMMITFLEET_REDIS_WAIT_REPLICAS": "1"}, Durability("replicas", 1, 1.0)),
        ({"COMMITFLEET_REDIS_WAIT_REPLICAS": "2"}, Durability("replicas", 2, 1.0)),
    ],
)
def test_levels_and_the_alias(env: dict[str, str], expected: Durability) -> None:
    assert durable(env) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"COMMITFLEET_REDIS_DURABILITY": "memory", "COMMITFLEET_REDIS_WAIT_REPLICAS": "1"},
            'redis.durability = "memory" waits for no replica, but redis.wait_replicas = 1: '
            'set durability = "replicas", or wait_replicas = 0',
        ),
        (
            {"COMMITFLEET_REDIS_DURABILITY": "aof", "COMMITFLEET_REDIS_WAIT_REPLICAS": "2"},
            'redis.durability = "aof" waits for no replica, but redis.wait_replicas = 2: '
            'set durability = "aof+replicas", or wait_replicas = 0',
        ),
        (
            {"COMMITFLEET_REDIS_DURABILITY": "disk"},
            "redis.durability must be one of memory, replicas, aof, aof+replicas (got 'disk')",
        ),
        ({"COMMITFLEET_REDIS_DURABILITY": "AOF"}, "redis.durability must be one of"),
        ({"COMMITFLEET_REDIS_WAIT_REPLICAS": "-1"}, "redis.wait_replicas must be >= 0"),
        (
            {"COMMITFLEET_REDIS_DURABILITY": "replicas", "COMMITFLEET_REDIS_WAIT_TIMEOUT": "0"},
            "redis.wait_timeout must be > 0",
        ),
    ],
)
def test_bad_values_and_contradictions_are_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env=env)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_level_comes_from_a_toml_file_too(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[redis]\ndurability = "aof+replicas"\nwait_replicas = 2\nwait_timeout = 3.0\n')
    assert load_settings(path, env={}).redis.durable == Durability("aof+replicas", 2, 3.0)
    path.write_text('[redis]\ndurability = "aof"\nwait_replicas = 2\n')
    with pytest.raises(ConfigError, match='durability = "aof" waits for no replica'):
        load_settings(path, env={})


def test_the_commands_each_level_sends() -> None:
    assert Durability("replicas", 2, 1.0).command() == ("WAIT", 2, 1000)
    assert Durability("aof", 0, 0.25).command() == ("WAITAOF", 1, 0, 250)
    assert Durability("aof+replicas", 1, 2.0).command() == ("WAITAOF", 1, 1, 2000)
    assert Durability("replicas", 1, 0.0001).command() == ("WAIT", 1, 1)  # never 0: WAIT 0 blocks for ever
    with pytest.raises(ValueError, match="memory"):
        Durability().command()
    assert not Durability().waits and Durability("aof").aof and not Durability("replicas", 1).aof
    assert Durability("aof+replicas", 2).describe() == "aof+replicas (2)"
    for level, replicas in (("memory", 1), ("aof", 1), ("replicas", 0), ("aof+replicas", 0), ("disk", 0)):
        with pytest.raises(ValueError):
            Durability(level, replicas)  # type: ignore[arg-type]


def test_resolve_is_the_settings_rule() -> None:
    assert resolve_durability("", 0) == Durability()
    assert resolve_durability("", 3, 2.0) == Durability("replicas", 3, 2.0)
    assert RedisSettings(durability="aof").durable == Durability("aof")
    with pytest.raises(ValueError, match="waits for no replica"):
        RedisSettings(durability="memory", wait_replicas=1)


def test_the_producer_config_carries_and_checks_the_level() -> None:
    settings = load_settings(
        env={"COMMITFLEET_REDIS_DURABILITY": "aof+replicas", "COMMITFLEET_REDIS_WAIT_REPLICAS": "2"},
        overrides={"store": {"url": "file:///tmp/x"}},
    )
    config = ProducerConfig.from_settings(settings)
    assert config.redis_durability == "aof+replicas"
    assert config.redis_settings.durable == Durability("aof+replicas", 2, 1.0)
    # The old fields alone still mean "replicas".
    old = ProducerConfig(redis_url="redis://h:1/0", store_url="file:///x", redis_wait_replicas=1)
    assert old.redis_settings.durable == Durability("replicas", 1, 1.0)
    with pytest.raises(ConfigError, match='durability = "aof" waits for no replica'):
        ProducerConfig(
            redis_url="redis://h:1/0", store_url="file:///x", redis_durability="aof", redis_wait_replicas=1
        )
    with pytest.raises(ConfigError, match="must be one of"):
        ProducerConfig(redis_url="redis://h:1/0", store_url="file:///x", redis_durability="fsync")
    # It is pickled into every task.
    assert pickle.loads(pickle.dumps(config)).redis_settings.durable == Durability("aof+replicas", 2, 1.0)
