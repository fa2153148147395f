"""Credentials never show: Secret's masks, the Redis URL split, settings and the producer config."""

from __future__ import annotations

import pickle
from pathlib import Path
from urllib.parse import quote

import msgspec
import pytest

from shared import ConfigError, Secret, load_settings
from shared.queue import connect, connect_sync
from shared.settings import (
    MASK,
    RedisSettings,
    SecuritySettings,
    StoreSettings,
    masked_url,
    secret_enc_hook,
    split_redis_url,
)
from shared.spark import ProducerConfig

# Every character the issue names, and then some: '#', '/', '@', ':', '?', '%', space.
PLANTED = "s3cr#t/p@ss:w0rd?x%41 y"
# In a URL as it is (not percent-encoded): the characters the issue names.
RAW = "s3cr#t/p@ss:w0rd"
HMAC = "hmac-planted-7f3a9c"
AZURE = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=azure-planted-key==;BlobEndpoint=http://h"


def test_a_secret_is_masked_everywhere_it_can_be_shown() -> None:
    s = Secret(PLANTED)
    shown = [repr(s), str(s), f"{s}", f"{s!r}", f"{s:>30}", "%s" % s, repr([s]), repr({"k": s})]  # noqa: UP031
    assert all(PLANTED not in text for text in shown), shown
    assert str(s) == MASK and repr(s) == repr(MASK)
    assert s.reveal() == PLANTED and s.reveal_bytes() == PLANTED.encode()
    assert bool(s) and not Secret() and repr(Secret()) == "''" and Secret().reveal_bytes() is None
    assert s == Secret(PLANTED) and s != Secret("other") and hash(s) == hash(Secret(PLANTED))
    assert Secret(s).reveal() == PLANTED
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.reveal() == PLANTED
    with pytest.raises(TypeError):
        Secret(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "clean", "password"),
    [
        # raw: the user part ends at the last @
        (f"redis://:{RAW}@h:6379/0", "redis://h:6379/0", RAW),
        (f"redis://:{quote(PLANTED, safe='')}@h:6379/0", "redis://h:6379/0", PLANTED),  # percent-encoded
        ("redis://:s3cr#t@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", "s3cr#t"),  # the URL
        ("rediss://alice:pw/with/slashes@h:6380/1", "rediss://alice@h:6380/1", "pw/with/slashes"),
        ("redis://alice@h/0", "redis://alice@h/0", None),
        ("redis://h:6379/0?password=qp%23x&db=2", "redis://h:6379/0?db=2", "qp#x"),
        ("unix://:pw@/run/redis.sock?db=0", "unix:///run/redis.sock?db=0", "pw"),
        ("redis://h:6379/0", "redis://h:6379/0", None),
        ("rediss://:pw@h/0?ssl_ca_certs=/a@b/ca.pem", "rediss://h/0?ssl_ca_certs=/a@b/ca.pem", "pw"),
    ],
)
def test_the_password_leaves_the_url(url: str, clean: str, password: str | None) -> None:
    assert split_redis_url(url) == (clean, password)
    if password:
        assert password not in masked_url(url) and MASK in masked_url(url)


def test_settings_move_the_password_out_of_redis_url_and_mask_every_credential() -> None:
    env = {
        "REDIS_URL": f"redis://:{quote(PLANTED, safe='')}@127.0.0.1:6379/0",
        "COMMITFLEET_SECURITY_HMAC_SECRET": HMAC,
        "COMMITFLEET_STORE_AZURE_CONNECTION_STRING": AZURE,
        "COMMITFLEET_STORE_AZURE_ACCOUNT_URL": "https://a.blob.core.windows.net/?sv=2024&sig=planted-sas",
    }
    s = load_settings(env=env)
    assert s.redis.url == "redis://127.0.0.1:6379/0"
    assert s.redis.password.reveal() == PLANTED
    assert s.security.hmac_secret.reveal() == HMAC
    assert s.store.azure_connection_string.reveal() == AZURE
    text = repr(s) + str(s) + repr(pickle.loads(pickle.dumps(s)))
    for planted in (PLANTED, quote(PLANTED, safe=""), HMAC, "azure-planted-key", "planted-sas"):
        assert planted not in text
    assert "planted-sas" in s.store.azure_account_url.reveal()
    # The raw password through its own setting (no escaping), and REDIS_PASSWORD.
    raw = load_settings(env={"COMMITFLEET_REDIS_PASSWORD": PLANTED})
    assert raw.redis.password.reveal() == PLANTED and PLANTED not in repr(raw)
    assert load_settings(env={"REDIS_PASSWORD": PLANTED}).redis.password.reveal() == PLANTED
    # Built in code with plain strings: wrapped all the same.
    assert isinstance(RedisSettings(password=PLANTED).password, Secret)  # type: ignore[arg-type]
    assert isinstance(SecuritySettings(hmac_secret=HMAC).hmac_secret, Secret)  # type: ignore[arg-type]
    assert isinstance(StoreSettings(azure_connection_string=AZURE).azure_connection_string, Secret)  # type: ignore[arg-type]
    # A document for a child process carries the value (and only such a document).
    doc = msgspec.to_builtins(s, enc_hook=secret_enc_hook)
    assert doc["redis"]["password"] == PLANTED


def test_config_errors_never_echo_a_password() -> None:
    both = {"REDIS_URL": f"redis://:{PLANTED}@h/0", "COMMITFLEET_REDIS_PASSWORD": "other-planted"}
    with pytest.raises(ConfigError) as info:
        load_settings(env=both)
    assert PLANTED not in str(info.value) and "other-planted" not in str(info.value)
    for url in (f"redis://:{PLANTED}@h:notaport/0", f"redis://:{PLANTED}@h:6379/0?db=x"):
        settings = RedisSettings(url=url)
        for make in (connect, connect_sync):
            with pytest.raises(ConfigError) as bad:
                make(settings)
            text = str(bad.value) + repr(bad.value.__cause__) + repr(bad.value.__context__)
            assert PLANTED not in text and "s3cr" not in text, text
    with pytest.raises(ConfigError) as wrong_scheme:
        load_settings(env={"REDIS_URL": f"http://:{PLANTED}@h/0"})
    assert "s3cr" not in str(wrong_scheme.value)


def test_the_producer_config_and_its_pickled_copy_show_no_credential() -> None:
    cfg = ProducerConfig(
        redis_url=f"redis://:{quote(PLANTED, safe='')}@127.0.0.1:6379/0",
        store_url="file:///tmp/x",
        hmac_secret=HMAC,  # type: ignore[arg-type]  # a plain str is accepted and wrapped
        store=StoreSettings(azure_connection_string=Secret(AZURE)),
    )
    assert cfg.redis_url == "redis://127.0.0.1:6379/0"
    assert cfg.redis_password.reveal() == PLANTED and cfg.hmac_secret.reveal() == HMAC
    assert cfg.redis_settings.password.reveal() == PLANTED
    shipped = pickle.loads(pickle.dumps(cfg))
    assert shipped == cfg and shipped.hmac_secret.reveal() == HMAC
    for text in (repr(cfg), str(cfg), repr(shipped)):
        for planted in (PLANTED, quote(PLANTED, safe=""), HMAC, "azure-planted-key"):
            assert planted not in text
    back = msgspec.convert(
        msgspec.to_builtins(cfg, enc_hook=secret_enc_hook),
        ProducerConfig,
        dec_hook=__import__("shared.settings", fromlist=["x"]).secret_dec_hook,
    )
    assert back == cfg
    s = load_settings(
        env={"REDIS_URL": f"redis://:{quote(PLANTED, safe='')}@h/0", "COMMITFLEET_STORE": "file:///x"}
    )
    from_settings = ProducerConfig.from_settings(s)
    assert from_settings.redis_password.reveal() == PLANTED and PLANTED not in repr(from_settings)
    with pytest.raises(ConfigError) as both:
        ProducerConfig(redis_url=f"redis://:{PLANTED}@h/0", store_url="file:///x", redis_password=Secret("y"))
    assert PLANTED not in str(both.value)


def test_a_password_follows_the_precedence_of_the_url_that_carried_it(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[redis]\nurl = "redis://h/0"\npassword = "from-the-file"\n')
    assert load_settings(cfg, env={}).redis.password.reveal() == "from-the-file"
    over = load_settings(cfg, env={"REDIS_URL": "redis://:from-env@h2/0"})
    assert (over.redis.url, over.redis.password.reveal()) == ("redis://h2/0", "from-env")
    # Only the file gives both: the one-line error names the source, not the values.
    cfg.write_text('[redis]\nurl = "redis://:in-url@h/0"\npassword = "from-the-file"\n')
    with pytest.raises(ConfigError) as both:
        load_settings(cfg, env={})
    assert "in-url" not in str(both.value) and "from-the-file" not in str(both.value)
