"""One lock per dataset, kept only while someone holds or waits for it.

A plain ``dict[str, asyncio.Lock]`` filled with ``setdefault`` keeps a lock
for every dataset a shard ever handled: memory that grows with history. Here
each entry counts its users (the holder and the waiters) and disappears when
the last one leaves, so the table is as large as the open work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class _Slot:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class DatasetLocks:
    """Per-dataset mutual exclusion whose table holds only the datasets in use."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def busy(self, dataset: str) -> bool:
        """Return whether someone holds ``dataset``'s lock now."""
        slot = self._slots.get(dataset)
        return slot is not None and slot.lock.locked()

    @contextlib.asynccontextmanager
    async def hold(self, dataset: str) -> AsyncIterator[None]:
        """Hold ``dataset``'s lock for the body (waits while another task holds it).

        The entry is dropped when its last user (holder or waiter) leaves,
        whichever way: body done, body raised, or the wait cancelled.

        Cancellation: while waiting, the wait ends and the entry is released;
        while holding, the lock is released and the cancellation goes on.
        """
        slot = self._slots.get(dataset)
        if slot is None:
            slot = self._slots[dataset] = _Slot()
        slot.users += 1
        try:
            async with slot.lock:
                yield
        finally:
            slot.users -= 1
            if slot.users == 0:
                del self._slots[dataset]


__all__ = ["DatasetLocks"]
