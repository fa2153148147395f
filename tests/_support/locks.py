"""Helpers for the storage-lock tests: lock settings, one lock's name and key, its record, predicates.

The fault-injecting store of those tests is :class:`tests._support.fault_store.FaultStore`
(its :class:`~tests._support.fault_store.Fault` rules take :func:`is_release` or
:func:`is_renewal` as ``when``).
"""

from __future__ import annotations

from shared import RetryPolicy
from shared.locks import LockRecord, StorageLock, lock_key, read_lock
from shared.locks._state import decode_record
from shared.settings import LockSettings
from shared.storage import CountingStore, ObjectStore

FAST = LockSettings(
    validity=1.2, renew_interval=0.3, max_drift=0.1, acquire_timeout=10.0, poll_min=0.01, poll_max=0.1
)
# A waiter that polls every 30 s: anything faster is a wake-up, not a poll.
SLOW_POLL = LockSettings(
    validity=60.0, renew_interval=10.0, poll_min=30.0, poll_max=30.0, acquire_timeout=120.0
)
NAME = "ds1"
KEY = lock_key(NAME)


def lock(store: ObjectStore, owner: str, settings: LockSettings = FAST) -> StorageLock:
    """Return a lock on :data:`NAME` for ``owner`` whose retries never sleep."""
    return StorageLock(store, NAME, owner=owner, settings=settings, retry=RetryPolicy(budget=5.0).no_wait())


async def stored(store: ObjectStore) -> LockRecord:
    """Return the stored record of :data:`NAME` (asserting there is one)."""
    rec = await read_lock(store, NAME)
    assert rec is not None
    return rec


def is_release(data: bytes) -> bool:
    """Return True when the lock record written (``data``) releases the lock."""
    return decode_record(data).released


def is_renewal(data: bytes) -> bool:
    """Return True when the lock record written (``data``) keeps the lock held (a renewal)."""
    return not decode_record(data).released


class OtherProcess(CountingStore):
    """The same files seen under another name: this process's in-process wake-ups do not reach it,
    as for a contender in another process."""

    @property
    def url(self) -> str:
        return self._inner.url + "#other-process"
