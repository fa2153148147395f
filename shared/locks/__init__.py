"""The per-name storage lock (conditional writes, heartbeat, expiry takeover, fencing epoch).

``StorageLock(store, name, settings=...)`` is one contender: ``async with
lock.hold() as lease:`` for a block of work (cancelled with ``LockLost`` if the
lock is lost), or ``acquire()`` / ``release()`` to hold it for long and watch
``lease.lost``. ``read_lock(store, name)`` returns the stored record for status
displays. See docs/locks.md for the protocol.
"""

from ._held import HeldLease
from ._io import Clock, default_owner, read_lock
from ._lease import Lease
from ._lock import StorageLock
from ._notify import RedisReleaseNotifier, ReleaseNotifier, SharedReleaseNotifier
from ._state import LockRecord, held_until, is_held, lock_key

__all__ = [
    "Clock",
    "HeldLease",
    "Lease",
    "LockRecord",
    "RedisReleaseNotifier",
    "ReleaseNotifier",
    "SharedReleaseNotifier",
    "StorageLock",
    "default_owner",
    "held_until",
    "is_held",
    "lock_key",
    "read_lock",
]
