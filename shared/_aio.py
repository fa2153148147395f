"""Small asyncio helpers shared by the processes."""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType
from typing import Any


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


class TaskGroup(asyncio.TaskGroup):  # noqa: TID251 - the one subclass
    """``asyncio.TaskGroup`` that never leaves a cancel request on its parent task.

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

    async def __aexit__(
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


__all__ = ["TaskGroup", "cancel_until_done", "raise_if_cancelling"]
