"""The bounds on the commit's store calls: how many run at once, and how long one is retried.

- :func:`for_each_bounded`: bounded parallelism with plain errors (a TaskGroup
  whose failures come out as our own exceptions).
- :func:`commit_policy` / :func:`with_retry`: the commit's retry budget
  (``settings.commit.retry``), under which unknown outcomes are retried too:
  every attempt starts by re-reading, so an unknown outcome is never assumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import TypeVar

from .._aio import TaskGroup
from .._errors import CommitfleetError, LockLost, OutcomeUnknown, TransientError
from .._retry import RetryPolicy, retry
from ..settings import Settings
from ._errors import CommitStepFailed

T = TypeVar("T")


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


def pick_error(group: BaseExceptionGroup[BaseException]) -> CommitfleetError | None:
    """Return the one error that stands for ``group``, or None when it must propagate as a group.

    When every leaf is one of our errors, callers (retry loops, the quarantine
    logic) want one plain exception: a lost lock first, then a step that can
    never succeed, else the first. Anything else (a bug, a cancellation, a
    crash) is returned as None so the group itself propagates.
    """
    leaves = _leaves(group)
    if not leaves or not all(isinstance(e, CommitfleetError) for e in leaves):
        return None
    ours = [e for e in leaves if isinstance(e, CommitfleetError)]
    for kind in (LockLost, CommitStepFailed):
        for exc in ours:
            if isinstance(exc, kind):
                return exc
    return ours[0]


async def _aiter(items: AsyncIterable[T] | Iterable[T]) -> AsyncIterable[T]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def for_each_bounded(
    items: AsyncIterable[T] | Iterable[T],
    fn: Callable[[T], Awaitable[None]],
    limit: int,
    *,
    stop: Callable[[], bool] = lambda: False,
) -> None:
    """Await ``fn(item)`` for every item, at most ``limit`` at a time; stop starting new ones once ``stop()``.

    Returns when all started calls are finished.

    Raises:
        The error picked by :func:`pick_error` when calls fail with our errors
        (the others are cancelled first), else the TaskGroup's exception group.

    Cancelled: every call in flight is cancelled and awaited.
    """
    sem = asyncio.Semaphore(limit)

    async def one(item: T) -> None:
        try:
            await fn(item)
        finally:
            sem.release()

    try:
        async with TaskGroup() as tg:
            async for item in _aiter(items):
                # Taken here, released by the task: bounds running and pending calls alike.
                await sem.acquire()
                if stop():
                    sem.release()
                    break
                tg.create_task(one(item))
    except BaseExceptionGroup as group:
        picked = pick_error(group)
        if picked is None:
            raise
        raise picked from group


def commit_policy(settings: Settings) -> RetryPolicy:
    """Return the retry policy of commit steps described by ``settings.commit.retry``."""
    return RetryPolicy.from_settings(settings.commit.retry)


def retrying(policy: RetryPolicy) -> RetryPolicy:
    """Return ``policy`` retrying unknown outcomes too (every attempt starts by re-reading)."""
    return RetryPolicy(
        attempts=policy.attempts,
        initial=policy.initial,
        maximum=policy.maximum,
        budget=policy.budget,
        retry_on=(TransientError, OutcomeUnknown),
        wait=policy.wait,
    )


async def with_retry(fn: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Run ``fn`` under ``policy``, also retrying unknown outcomes. Returns what ``fn`` returned."""
    return await retry(fn, retrying(policy))


__all__ = ["commit_policy", "for_each_bounded", "pick_error", "retrying", "with_retry"]
