"""A coroutine that loses cancellations, as redis-py's ``wait_for`` loses one on Python 3.11."""

from __future__ import annotations

import asyncio


async def loses_cancels(
    lost: int,
    cancels: list[int],
    *,
    started: asyncio.Event | None = None,
    free: asyncio.Event | None = None,
) -> None:
    """Wait forever, dropping the first ``lost`` cancellations (every one until ``free`` is set).

    Appends to ``cancels`` once per cancellation received; sets ``started`` when running.
    Raises CancelledError on the first cancellation past those it drops.
    """
    if started is not None:
        started.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancels.append(1)
            if len(cancels) > lost or (free is not None and free.is_set()):
                raise
