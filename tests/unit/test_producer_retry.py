"""The Spark producer's retry budget (``ProducerConfig.redis_retry_budget``): long enough for a failover.

The publisher's own default policy (8 attempts, delays up to 2 s) gives up
within about 5 s, shorter than Sentinel's default ``down-after-milliseconds``
(30 s) alone. The producer's policy ends on its time budget instead (60 s by
default), under the same capped, jittered backoff. The real failover is in
tests/sentinel/test_producer_failover.py (``make redis-ha``).
"""

from __future__ import annotations

import random

import pytest

from shared import ConfigError, RetryPolicy
from shared.spark import ProducerConfig

SENTINEL_DEFAULT_FAILOVER_S = 30.0 + 2.0  # down-after-milliseconds 30 s, then the election


def tries_within(policy: RetryPolicy, seconds: float, seed: int) -> tuple[int, float]:
    """Return (retries the policy allows before ``seconds`` of waiting, the seconds its delays add up to)."""
    waited = 0.0
    n = 0
    for delay in policy.delays(random.Random(seed)):
        if waited + delay > seconds:
            break
        waited += delay
        n += 1
    return n, waited


def test_the_default_budget_outlasts_a_default_sentinel_failover() -> None:
    config = ProducerConfig(redis_url="redis://h:1/0", store_url="file:///x")
    policy = config.retry_policy
    assert config.redis_retry_budget == policy.budget == 60.0
    assert policy.maximum == 2.0  # capped: a retry comes at most 2 s after Redis is back
    for seed in range(20):
        retries, waited = tries_within(policy, policy.budget, seed)
        # Attempts never run out first: the delays reach the budget, and past a failover's length.
        assert waited > SENTINEL_DEFAULT_FAILOVER_S, (seed, retries, waited)
        assert retries > 30


def test_the_publishers_own_default_does_not() -> None:
    for seed in range(20):
        _retries, waited = tries_within(RetryPolicy(), 60.0, seed)
        assert waited < 5.2  # 0.05 + 0.1 + ... + 1.6 + 2.0 at most: why the producer has its own budget


def test_the_budget_is_a_setting() -> None:
    config = ProducerConfig(redis_url="redis://h:1/0", store_url="file:///x", redis_retry_budget=5.0)
    assert config.retry_policy.budget == 5.0
    with pytest.raises(ConfigError, match="redis_retry_budget"):
        ProducerConfig(redis_url="redis://h:1/0", store_url="file:///x", redis_retry_budget=0)
