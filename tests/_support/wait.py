"""Poll a condition with a deadline instead of sleeping to synchronise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Await ``probe()`` until it returns a truthy value; return that value.

    Raises AssertionError naming ``what`` when ``timeout`` passes first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        await asyncio.sleep(interval)


def wait_for_sync(
    probe: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"
) -> T:
    """Blocking twin of :func:`wait_for` for fixtures that are not async."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(interval)
