"""RetryPolicy's delays: full jitter under a cap that holds however many retries a loop makes."""

from __future__ import annotations

import random

from shared._retry import RetryPolicy


def test_the_cap_holds_for_a_loop_that_never_gives_up() -> None:
    policy = RetryPolicy(initial=0.1, maximum=5.0)
    rng = random.Random(7)
    # Far past the point where 0.1 * 2**n overflows a float (n > 1023).
    delays = [policy.delay(n, rng) for n in (0, 1, 5, 50, 1_000, 100_000)]
    assert all(0.0 <= d <= 5.0 for d in delays)
    assert delays[0] <= 0.1


def test_delays_grow_then_stay_under_the_cap() -> None:
    policy = RetryPolicy(initial=0.1, maximum=1.0)
    rng = random.Random(1)
    draws = [[policy.delay(n, rng) for _ in range(200)] for n in range(6)]
    assert max(draws[0]) <= 0.1
    assert max(draws[2]) <= 0.4
    assert 0.8 < max(draws[5]) <= 1.0


def test_delays_are_the_first_attempts_minus_one_delays() -> None:
    policy = RetryPolicy(attempts=5, initial=0.1, maximum=1.0)
    one, other = random.Random(3), random.Random(3)
    assert list(policy.delays(one)) == [policy.delay(n, other) for n in range(4)]
    assert list(policy.no_wait().delays()) == [0.0] * 4
