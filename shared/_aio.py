"""Small asyncio helpers shared by the processes."""

from __future__ import annotations

import asyncio
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


__all__ = ["cancel_until_done"]
