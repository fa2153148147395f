"""Retries as values: capped, jittered exponential backoff with a total budget.

A :class:`RetryPolicy` is a frozen value; :func:`retry` runs an async callable
under it. Only the exception types named in ``retry_on`` are retried (by default
:class:`~shared._errors.TransientError`); everything else propagates at once.
``RetryPolicy.no_wait()`` gives a policy for tests that never sleeps.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ._errors import TransientError
from .settings import RetrySettings

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry.

    ``attempts`` counts the first try. Delay ``n`` is drawn uniformly from
    ``[0, min(maximum, initial * 2**n)]`` ("full jitter"), and no retry starts
    once ``budget`` seconds have passed since the first try.
    """

    attempts: int = 8
    initial: float = 0.05
    maximum: float = 2.0
    budget: float = 60.0
    retry_on: tuple[type[BaseException], ...] = (TransientError,)
    wait: bool = field(default=True)

    @classmethod
    def from_settings(cls, s: RetrySettings) -> RetryPolicy:
        """Return the policy the given settings describe."""
        return cls(attempts=s.attempts, initial=s.initial, maximum=s.maximum, budget=s.budget)

    def no_wait(self) -> RetryPolicy:
        """Return the same policy with every delay zero (test mode)."""
        return replace(self, wait=False)

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """Yield the delay before each retry (``attempts - 1`` values)."""
        rng = rng or random.Random()
        for n in range(self.attempts - 1):
            yield self.delay(n, rng)

    def delay(self, n: int, rng: random.Random) -> float:
        """Return the delay before retry ``n`` (0-based), ignoring ``attempts`` and ``budget``.

        For loops that never give up (a reader that reconnects for the life of
        the process): any ``n`` is fine, the cap holds however large it grows.
        """
        cap = min(self.maximum, self.initial * 2.0 ** min(n, 60))
        return rng.uniform(0, cap) if self.wait else 0.0


async def retry(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Await ``fn()`` until it succeeds or the policy is spent.

    Returns:
        What ``fn()`` returned.

    Raises:
        The last retryable error once attempts or budget are spent, or any
        non-retryable error at once.

    Cancellation propagates immediately (never retried).
    """
    start = time.monotonic()
    delays = policy.delays()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn()
        except policy.retry_on as exc:
            delay = next(delays, None)
            if delay is None or time.monotonic() - start + delay > policy.budget:
                raise
            if on_retry is not None:
                on_retry(attempt, exc)
            await asyncio.sleep(delay)


__all__ = ["RetryPolicy", "retry"]
