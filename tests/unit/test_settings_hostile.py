"""Settings that parse but mean nothing stop with one line: NaN, infinity, bytes that are not text."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import ConfigError, load_settings


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        ("COMMITFLEET_WORKER_LEASE", "nan", "worker.lease must be a finite number"),
        ("COMMITFLEET_WORKER_HEARTBEAT", "nan", "worker.heartbeat must be a finite number"),
        ("COMMITFLEET_LOCK_VALIDITY", "inf", "lock.validity must be a finite number"),
        ("COMMITFLEET_WORKER_JOB_TIMEOUT", "NaN", "worker.job_timeout must be a finite number"),
        ("COMMITFLEET_COORDINATOR_REQUEST_TIMEOUT", "nan", "coordinator.request_timeout"),
        ("COMMITFLEET_COMMIT_RETRY_MAXIMUM", "inf", "commit.retry"),
        ("COMMITFLEET_WORKER_LEASE", "\udcff", "COMMITFLEET_WORKER_LEASE is not valid UTF-8 text"),
        ("REDIS_URL", "redis://\udcfe/0", "REDIS_URL is not valid UTF-8 text"),
        ("COMMITFLEET_WORKER_READ_BATCH", "1000000000", "worker.read_batch must be 1..10000"),
        ("COMMITFLEET_WORKER_MAX_QUEUED_WORK", "0", "worker.max_queued_work >= 1"),
    ],
)
def test_a_meaningless_value_in_the_environment_is_one_config_error(
    var: str, value: str, needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={var: value})
    assert needle in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (b"[worker]\nlease = nan\n", "worker.lease must be a finite number"),
        (b"[lock]\nvalidity = inf\n", "lock.validity must be a finite number"),
        (b"\xff\xfe[worker]\n", "is not UTF-8 text"),
        (b'[fleet]\nname = "\xe9t\xe9"\n', "is not UTF-8 text"),
    ],
)
def test_a_meaningless_config_file_is_one_config_error(tmp_path: Path, text: bytes, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert needle in str(caught.value)
    assert "\n" not in str(caught.value)


def test_finite_values_still_load() -> None:
    s = load_settings(env={"COMMITFLEET_WORKER_LEASE": "30", "COMMITFLEET_LOCK_VALIDITY": "1e2"})
    assert (s.worker.lease, s.lock.validity) == (30.0, 100.0)
