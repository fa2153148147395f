"""General asyncio helpers: a task group that always ends, cancelling until done, shielded cleanup."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
from collections.abc import Awaitable, Coroutine, Generator
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("shared.aio")


async def cancel_until_done(task: asyncio.Future[Any], *, every_s: float = 0.2) -> None:
    """Cancel ``task`` and wait until it has really ended; return then.

    A cancellation can get lost on Python 3.11: redis-py sends every command
    through ``asyncio.wait_for`` (a socket timeout is set), and 3.11's
    ``wait_for`` drops a cancellation that lands just as the send completes;
    the task then goes on. So this cancels again every ``every_s`` seconds
    until the task is done. Does not raise what the task raised.

    Cancelled itself: stops waiting (the task has been asked to stop).
    """
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=every_s)


async def run_shielded(aw: Awaitable[T]) -> T:
    """Run ``aw`` to completion even if the caller is cancelled meanwhile.

    Returns:
        What ``aw`` returned, when the caller was not cancelled.

    Raises:
        Whatever ``aw`` raised; or, when the caller was cancelled while
        waiting, CancelledError after ``aw`` has finished (its result or error
        is then dropped, with an error logged).
    """
    task = asyncio.ensure_future(aw)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.cancelled():
                raise  # the shielded work itself was cancelled (loop shutdown)
            cancelled = exc
    if cancelled is not None:
        if not task.cancelled() and task.exception() is not None:
            log.error("shielded cleanup failed during cancellation", exc_info=task.exception())
        raise cancelled
    return task.result()


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` when the current task has a cancel request pending; else return.

    Called right after a blocking Redis read: on Python 3.11 redis-py can
    lose a cancellation that lands just as a blocking read returns data (the
    task reads on, "cancelling"), so a read loop would go on until the next
    cancel. Checking here ends it within one block instead. Entries the read
    returned are left pending (read again by the next reader).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


# How often an aborting group cancels again a child that is still running.
RECANCEL_S = 0.2


class TaskGroup(asyncio.TaskGroup):  # noqa: TID251 - the one subclass
    """``asyncio.TaskGroup`` that ends even when a child loses its cancellation,
    and never leaves a cancel request on its parent task.

    A group that aborts (its body raised or was cancelled, or a child failed)
    cancels each child once and waits for them all. On Python 3.11 a
    cancellation that lands as a redis-py command completes is dropped inside
    that command's ``wait_for`` (see :func:`cancel_until_done`): the child goes
    on, a loop goes on for good, and the group, and every task above it, waits
    forever (a worker's shard runner hung so, its shard assigned to it and
    served by nobody). So while it aborts, this group cancels its unfinished
    children again every ``RECANCEL_S`` seconds until they have ended. A child
    that a body cancels on its own while the group is NOT aborting is that
    body's to see through: :func:`cancel_until_done`.

    On Python 3.11 a child that fails while the group is already waiting in
    ``__aexit__`` (the body has ended) makes the group cancel its parent task
    and never take that request back (CPython gh-116720, fixed in 3.12): the
    parent's ``cancelling()`` stays one too high. A lease or a timeout scope
    later in the same task then reads that stray request as a cancellation
    from outside and lets a ``CancelledError`` through where a ``LockLost`` or
    a retry was due, and the work ends in silence. This subclass takes back
    the request its own failure handling made; use it everywhere instead of
    ``asyncio.TaskGroup`` (ruff's banned-api rule enforces that).
    """

    def __init__(self) -> None:
        super().__init__()
        self._children: set[asyncio.Task[Any]] = set()
        self._child_failed = False
        self._body_failed = False
        self._recancel_handle: asyncio.TimerHandle | None = None

    def create_task(
        self,
        coro: Generator[Any, None, T] | Coroutine[Any, Any, T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[T]:
        """Start a child (see :meth:`asyncio.TaskGroup.create_task`); return its task."""
        task = super().create_task(coro, name=name, context=context)
        if not task.done():
            self._children.add(task)
            task.add_done_callback(self._child_done)
        self._started(task)
        return task

    def _started(self, task: asyncio.Task[Any]) -> None:
        """Called with each child just started (a hook for subclasses)."""

    def _child_done(self, task: asyncio.Task[Any]) -> None:
        self._children.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._child_failed = True  # the group aborts: asyncio cancels the others

    def _recancel(self) -> None:
        if self._body_failed or self._child_failed:
            for task in list(self._children):
                if not task.done():
                    task.cancel()
        if self._children:
            self._recancel_handle = asyncio.get_running_loop().call_later(RECANCEL_S, self._recancel)

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._body_failed = et is not None
        self._recancel_handle = asyncio.get_running_loop().call_later(RECANCEL_S, self._recancel)
        try:
            await self._exit(et, exc, tb)
        finally:
            if self._recancel_handle is not None:
                self._recancel_handle.cancel()

    async def _exit(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if sys.version_info >= (3, 12):
            await super().__aexit__(et, exc, tb)
            return
        # 3.11 internals, read-only here: whether the group's own cancel request
        # was already made (then 3.11 takes it back itself) when the body ended.
        requested_before = self._parent_cancel_requested  # type: ignore[attr-defined]
        try:
            await super().__aexit__(et, exc, tb)
        finally:
            if not requested_before and self._parent_cancel_requested:  # type: ignore[attr-defined]
                self._parent_task.uncancel()  # type: ignore[attr-defined]


__all__ = ["TaskGroup", "cancel_until_done", "raise_if_cancelling", "run_shielded"]
