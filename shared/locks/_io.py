"""The storage lock's shared I/O helpers: owner ids, nonces, reading the lock object."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Final

import msgspec

from .._errors import NotFound, OutcomeUnknown, PreconditionFailed, TransientError
from .._nonce import nonce
from .._recent import GUESS_LIMIT, Recent
from ..storage import ObjectStore
from ._state import LockRecord, Observed, decode_record, lock_key

log = logging.getLogger("shared.locks")

Clock = Callable[[], float]

# Errors after which a conditional write may or may not have taken effect.
AMBIGUOUS: Final = (PreconditionFailed, NotFound, TransientError, OutcomeUnknown)
# Errors of a read that are worth another look later.
READ_AGAIN: Final = (TransientError, OutcomeUnknown)


def default_owner() -> str:
    """Return a fresh owner identity: ``<host>:<pid>:<random>`` (unique per call)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


def new_nonce() -> str:
    """Return a fresh random nonce (16 hex digits): one per write, so every write changes the bytes."""
    return nonce()


async def read_lock(store: ObjectStore, name: str) -> LockRecord | None:
    """Return the lock record of ``name`` as stored now, or None if there is none.

    For status displays: a record is held when :func:`~shared.locks.is_held`
    says so at the reader's time.

    Raises:
        BadInput: bad name, or the object is not a valid lock record.
        TransientError, OutcomeUnknown: the store failed.
    """
    observed = await observe(store, lock_key(name))
    return None if observed is None else observed.record


class SeenLocks:
    """The lock objects this process last read or wrote, by store and key: a guess, never a fact.

    An acquirer that finds a lock here released (typically by this process,
    at the end of its previous holding) claims it on that version at once,
    without reading it first; a lock never seen is claimed with
    create-if-absent. A wrong guess costs one refused write, then the usual
    read. Bounded: the oldest entries are forgotten first; the owner names,
    the same few for thousands of records, are kept once (interned).
    """

    def __init__(self, limit: int = GUESS_LIMIT) -> None:
        self._seen: Recent[Observed] = Recent(limit)

    def __len__(self) -> int:
        return len(self._seen)

    def get(self, store: ObjectStore, key: str) -> Observed | None:
        """Return what was last seen of ``key`` in ``store``, or None."""
        return self._seen.get(store.url, key)

    def put(self, store: ObjectStore, key: str, observed: Observed) -> None:
        """Remember ``observed`` as the latest state of ``key``."""
        record = observed.record
        owner = sys.intern(record.owner)
        if owner is not record.owner:
            observed = Observed(record=msgspec.structs.replace(record, owner=owner), version=observed.version)
        self._seen.put(store.url, key, observed)

    def forget(self, store: ObjectStore, key: str) -> None:
        """Forget ``key`` (its state is unknown)."""
        self._seen.forget(store.url, key)


SEEN = SeenLocks()


class ReleaseBoard:
    """Per process: the acquirers waiting for each lock, woken at once when a holder here releases it.

    A waiter registers (:meth:`watch`) for the whole of its acquire, and clears
    its event before each look at the lock, so a release that lands after the
    look wakes it. Waiters in other processes are not told here (they poll, or
    hear a :class:`ReleaseNotifier`). Thread-safe: waiters on other event loops
    are woken through their own loop.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._waiters: dict[tuple[str, str], set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    @contextlib.contextmanager
    def watch(self, store: ObjectStore, key: str) -> Iterator[asyncio.Event]:
        """Register a waiter for ``key`` while the block runs; yield the event a release sets."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        slot = (store.url, key)
        with self._mutex:
            self._waiters.setdefault(slot, set()).add(entry)
        try:
            yield entry[1]
        finally:
            with self._mutex:
                waiting = self._waiters.get(slot)
                if waiting is not None:
                    waiting.discard(entry)
                    if not waiting:
                        del self._waiters[slot]

    def notify(self, store: ObjectStore, key: str) -> int:
        """Wake every waiter of ``key`` in this process; return how many there were."""
        with self._mutex:
            entries = list(self._waiters.get((store.url, key), ()))
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, event in entries:
            if loop is current:
                event.set()
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed: its waiter is gone
                    loop.call_soon_threadsafe(event.set)
        return len(entries)


RELEASES = ReleaseBoard()


async def wait_for_release(event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
    """Wait until ``event`` is set or ``timeout`` seconds pass; return whether it was set.

    Cancelled: stops waiting (nothing to clean up).
    """
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def observe(store: ObjectStore, key: str) -> Observed | None:
    try:
        obj = await store.read(key)
    except NotFound:
        SEEN.forget(store, key)
        return None
    observed = Observed(record=decode_record(obj.data), version=obj.info.version)
    SEEN.put(store, key, observed)
    return observed


__all__ = ["Clock", "default_owner", "read_lock"]
