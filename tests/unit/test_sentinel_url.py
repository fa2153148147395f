"""The Sentinel URL form: its parts, the password kept out of it, bad URLs refused with one line."""

from __future__ import annotations

import pytest

from shared import ConfigError, load_settings
from shared.settings import MASK, RedisSettings, masked_url, parse_sentinel_url, split_redis_url
from shared.spark import ProducerConfig


def test_sentinel_url_parts() -> None:
    url = parse_sentinel_url(
        "rediss+sentinel://app:p%40ss@10.0.0.1:26380,sentinel-b,[::1]:26381/my.master-1/3"
        "?sentinel_auth=same&ssl_ca_certs=/ca.pem"
    )
    assert url.sentinels == (("10.0.0.1", 26380), ("sentinel-b", 26379), ("::1", 26381))
    assert (url.service, url.db, url.tls) == ("my.master-1", 3, True)
    assert (url.username, url.password, url.sentinel_auth) == ("app", "p@ss", True)
    assert url.options == (("ssl_ca_certs", "/ca.pem"),)
    plain = parse_sentinel_url("redis+sentinel://h:1/svc")
    assert (plain.db, plain.tls, plain.sentinel_auth, plain.username, plain.password) == (
        0,
        False,
        False,
        None,
        None,
    )
    assert not parse_sentinel_url("redis+sentinel://h/svc?sentinel_auth=none").sentinel_auth


def test_the_password_leaves_a_sentinel_url_and_is_masked() -> None:
    raw = "redis+sentinel://app:s3cr#t/@x@h1:26379,h2:26379/svc/1"
    assert split_redis_url(raw) == ("redis+sentinel://app@h1:26379,h2:26379/svc/1", "s3cr#t/@x")
    shown = masked_url(raw)
    assert "s3cr" not in shown and MASK in shown and shown.endswith("@h1:26379,h2:26379/svc/1")
    s = load_settings(env={"REDIS_URL": raw})
    assert s.redis.url == "redis+sentinel://app@h1:26379,h2:26379/svc/1"
    assert s.redis.password.reveal() == "s3cr#t/@x"
    # The Spark producer takes the same URL (its executors' publisher too).
    producer = ProducerConfig(redis_url=raw, store_url="file:///tmp/x")
    assert producer.redis_url == s.redis.url and producer.redis_password.reveal() == "s3cr#t/@x"
    assert producer.redis_settings.url.startswith("redis+sentinel://")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://h:1", "names the master group"),
        ("redis+sentinel://h:1/", "names the master group"),
        ("redis+sentinel:///svc", "bad sentinel ''"),
        ("redis+sentinel://h:1,,h:2/svc", "bad sentinel ''"),
        ("redis+sentinel://h:99999/svc", "bad port"),
        ("redis+sentinel://h:x/svc", "bad sentinel 'h:x'"),
        ("redis+sentinel://h:1/svc/x", "bad database 'x'"),
        ("redis+sentinel://h:1/svc/-1", "bad database"),
        ("redis+sentinel://h:1/sv c", "bad sentinel service name"),
        ("redis+sentinel://h:1/svc?db=2", "unknown sentinel url option"),
        ("redis+sentinel://h:1/svc?sentinel_auth=yes", "sentinel_auth must be one of"),
        ("redis+sentinel+cluster://h:1/svc", "Cluster and Sentinel do not combine"),
        ("rediss+cluster+sentinel://h:1", "Cluster and Sentinel do not combine"),
        ("sentinel://h:1/svc", "must start with"),
    ],
)
def test_a_wrong_sentinel_url_stops_the_settings_with_one_line(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        load_settings(env={}, overrides={"redis": {"url": url}})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=why):
        ProducerConfig(redis_url=url, store_url="file:///tmp/x")


def test_a_bad_url_never_echoes_its_password() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(env={}, overrides={"redis": {"url": "redis+sentinel://:hunter2@h:1/svc/db"}})
    assert "hunter2" not in str(err.value)
    with pytest.raises(ValueError, match="names the master group") as verr:
        RedisSettings(url="redis+sentinel://:hunter2@h:1")
    assert "hunter2" not in str(verr.value)
