"""The storage lock's async layer: acquire, heartbeat, release, over an ObjectStore.

Protocol (decisions in ``_state.py``): one JSON object per lock at
``_locks/<name>.json``. Acquire creates it (create-if-absent) or, when it is
released or expired, overwrites it on the version just read (overwrite-if-
match), raising the epoch by one. A heartbeat task renews by overwrite-if-match
every ``renew_interval``; release writes ``released: true`` the same way,
retried on throttling and transient errors.

Every conditional write whose answer is not a plain success (412 after an SDK
retry, a timeout, a 5xx) is settled by re-reading the object and looking for
our own owner and nonce, never by guessing. A lease that is lost (renewal
refused, or its local deadline passed before a renewal got through) sets
:attr:`HeldLease.lost`, and when the lease guards a block (``async with``) that
block's task is cancelled at once and the block ends with :class:`LockLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Final, TypeVar

from .._errors import (
    ConfigError,
    Fenced,
    LockLost,
    LockTimeout,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    TransientError,
)
from .._retry import RetryPolicy, retry
from .._settings import LockSettings
from ..storage import ObjectStore
from ._state import (
    Create,
    LockRecord,
    Observed,
    Ours,
    Resolution,
    TakeOver,
    Wait,
    claim_record,
    decide_acquire,
    decode_record,
    encode_record,
    local_deadline,
    lock_key,
    poll_delay,
    released_record,
    renewed_record,
    resolve_holder_write,
)

log = logging.getLogger("shared.locks")

T = TypeVar("T")
Clock = Callable[[], float]

# Errors after which a conditional write may or may not have taken effect.
_AMBIGUOUS: Final = (PreconditionFailed, NotFound, TransientError, OutcomeUnknown)
# Errors of a read that are worth another look later.
_READ_AGAIN: Final = (TransientError, OutcomeUnknown)


def default_owner() -> str:
    """Return a fresh owner identity: ``<host>:<pid>:<random>`` (unique per call)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


def _nonce() -> str:
    return secrets.token_hex(8)


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


async def read_lock(store: ObjectStore, name: str) -> LockRecord | None:
    """Return the lock record of ``name`` as stored now, or None if there is none.

    For status displays: a record is held when :func:`~shared.locks.is_held`
    says so at the reader's time.

    Raises:
        BadInput: bad name, or the object is not a valid lock record.
        TransientError, OutcomeUnknown: the store failed.
    """
    observed = await _observe(store, lock_key(name))
    return None if observed is None else observed.record


async def _observe(store: ObjectStore, key: str) -> Observed | None:
    try:
        obj = await store.read(key)
    except NotFound:
        return None
    return Observed(record=decode_record(obj.data), version=obj.info.version)


class HeldLease:
    """One holding of a :class:`StorageLock` (implements :class:`~shared.locks.Lease`).

    Created by :meth:`StorageLock.acquire` / :meth:`StorageLock.try_acquire`
    with its heartbeat already running; the lease owns the heartbeat task and
    :meth:`release` awaits it. ``async with lease:`` guards a block: if the
    lease is lost, the block's task is cancelled and the block ends with
    :class:`LockLost` (or :class:`Fenced` when a newer holder was seen); the
    lease is released on the way out in every case.
    """

    def __init__(
        self,
        lock: StorageLock,
        *,
        record: LockRecord,
        version: str,
        write_started: float,
        took_over_from: str | None,
    ) -> None:
        self._lock = lock
        self._record = record
        self._version = version
        self._deadline = local_deadline(write_started, lock.settings)
        # Nonces of writes whose outcome is unknown, with the monotonic instant
        # each was sent; cleared on every confirmed write (a later write on an
        # older version can no longer land).
        self._pending: dict[str, float] = {}
        self._took_over_from = took_over_from
        self._lost = asyncio.Event()
        self._lost_error: LockLost | None = None
        self._superseded = False
        self._closing = False
        self._released = False
        self._heartbeat: asyncio.Task[None] | None = None
        self._guarded: asyncio.Task[object] | None = None
        self._guard_used = False
        self._cancelled_guarded = False
        self._last_seen: Observed | None = None

    # -- the Lease protocol -----------------------------------------------------------

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._lock.name

    @property
    def epoch(self) -> int:
        """The fencing epoch of this holding."""
        return self._record.epoch

    def check(self) -> None:
        """Return if the lease is still valid locally; raise otherwise.

        Raises:
            Fenced: a newer holder took the lock over.
            LockLost: the lease was released, a renewal was refused, or the
                local deadline (last renewal sent + validity - max_drift) passed.
        """
        if self._lost_error is not None:
            raise self._lost_error
        if self._released or self._closing:
            raise LockLost(f"lock {self.name} (epoch {self.epoch}) was released")
        if self._lock.monotonic() >= self._deadline:
            raise LockLost(f"lock {self.name} (epoch {self.epoch}) ran out locally before a renewal")

    # -- more about the holding ---------------------------------------------------------

    @property
    def owner(self) -> str:
        """The owner identity written in the lock object."""
        return self._record.owner

    @property
    def took_over_from(self) -> str | None:
        """The previous owner when this holding took over an expired lock, else None."""
        return self._took_over_from

    @property
    def lost(self) -> asyncio.Event:
        """Set once the lease is lost (renewal refused or local deadline passed)."""
        return self._lost

    @property
    def lost_error(self) -> LockLost | None:
        """Why the lease was lost (the error :meth:`check` raises), or None."""
        return self._lost_error

    @property
    def record(self) -> LockRecord:
        """The last lock record this holder knows it wrote."""
        return self._record

    @property
    def deadline(self) -> float:
        """The monotonic instant until which the lease is valid locally."""
        return self._deadline

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has finished."""
        return self._released

    # -- heartbeat ---------------------------------------------------------------------

    def _start(self) -> None:
        self._heartbeat = asyncio.create_task(
            self._beat_or_mark(), name=f"lock-heartbeat:{self.name}:{self.epoch}"
        )

    async def _beat_or_mark(self) -> None:
        try:
            await self._beat()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # A bug in the heartbeat must not leave the work running unprotected.
            self._mark_lost(LockLost(f"heartbeat of lock {self.name} failed: {exc!r}"))
            raise

    def _mark_lost(self, error: LockLost) -> None:
        if self._lost_error is not None:
            return
        self._lost_error = error
        self._lost.set()
        log.warning(
            "lock lost: %s",
            error,
            extra={"lock": self.name, "epoch": self.epoch, "owner": self.owner},
        )
        task = self._guarded
        if task is not None and not task.done():
            self._cancelled_guarded = True
            task.cancel(msg=f"lock {self.name} lost")

    async def _beat(self) -> None:
        s = self._lock.settings
        failures = 0
        mono = self._lock.monotonic
        while True:
            if failures == 0:
                delay = self._renewed_at() + s.renew_interval - mono()
            else:
                delay = poll_delay(failures - 1, now=0.0, until=None, settings=s, rng=self._lock.rng)
            await asyncio.sleep(max(0.0, min(delay, self._deadline - mono())))
            if mono() >= self._deadline:
                self._mark_lost(LockLost(f"lock {self.name} ran out locally before a renewal got through"))
                return
            timeout = asyncio.timeout(self._deadline - mono())
            try:
                async with timeout:
                    outcome = await self._renew_once()
            except TimeoutError:
                if not timeout.expired():
                    raise
                self._mark_lost(LockLost(f"lock {self.name} ran out locally while renewing"))
                return
            if outcome is Resolution.OURS:
                failures = 0
            elif outcome is Resolution.UNCHANGED:
                failures += 1
            else:
                self._superseded = True
                self._mark_lost(self._loss_reason("renewal refused"))
                return

    def _renewed_at(self) -> float:
        return self._deadline - self._lock.settings.validity + self._lock.settings.max_drift

    async def _renew_once(self) -> Resolution:
        lock = self._lock
        nonce = _nonce()
        started = lock.monotonic()
        record = renewed_record(self._record, now=lock.clock(), nonce=nonce, settings=lock.settings)
        self._pending[nonce] = started
        try:
            info = await lock.store.write_if_match(lock.key, encode_record(record), self._version)
        except _AMBIGUOUS as exc:
            log.debug("renewal of %s answered %r; re-reading", self.name, exc)
            return await self._resolve()
        self._confirm(record, info.version, started)
        return Resolution.OURS

    async def _resolve(self) -> Resolution:
        """Re-read after an ambiguous write; adopt the object if it shows one of our writes."""
        try:
            current = await _observe(self._lock.store, self._lock.key)
        except _READ_AGAIN:
            return Resolution.UNCHANGED
        outcome = resolve_holder_write(
            current,
            owner=self.owner,
            epoch=self.epoch,
            known_version=self._version,
            nonces=self._pending,
        )
        if outcome is Resolution.OURS:
            assert current is not None
            self._confirm(current.record, current.version, self._pending[current.record.nonce])
            if current.record.released:
                # Our own release landed (seen while releasing); nothing more to renew.
                return Resolution.OURS
        self._last_seen = current
        return outcome

    def _confirm(self, record: LockRecord, version: str, started: float) -> None:
        self._record = record
        self._version = version
        self._pending.clear()
        if not record.released:
            self._deadline = local_deadline(started, self._lock.settings)

    def _loss_reason(self, what: str) -> LockLost:
        current = self._last_seen
        if current is None:
            return LockLost(f"lock {self.name} (epoch {self.epoch}): {what}, the lock object is gone")
        rec = current.record
        msg = f"lock {self.name} (epoch {self.epoch}): {what}, now held by {rec.owner} (epoch {rec.epoch})"
        return Fenced(msg) if rec.epoch > self.epoch else LockLost(msg)

    async def _stop_heartbeat(self) -> None:
        hb, self._heartbeat = self._heartbeat, None
        if hb is None:
            return
        hb.cancel()
        # asyncio.wait never raises the task's CancelledError into us, so an
        # outside cancellation of the caller stays distinguishable.
        await asyncio.wait([hb])
        error = None if hb.cancelled() else hb.exception()
        if error is not None:
            raise error

    # -- release -------------------------------------------------------------------------

    async def release(self) -> None:
        """Stop the heartbeat and mark the lock released (once; later calls return at once).

        Transient errors and throttling are retried under the lock's
        RetryPolicy; an ambiguous answer is settled by re-reading. A lease that
        was already taken over is left alone (nothing is written).

        Raises:
            TransientError, OutcomeUnknown: the store kept failing past the
                retry policy, or did not answer within one validity; the
                lock then expires on its own.

        Cancellation: the release runs to completion first (shielded), then
        CancelledError propagates.
        """
        if self._released or self._closing:
            return
        self._closing = True
        try:
            await run_shielded(self._release())
        finally:
            self._released = True
            self._lock._forget(self)

    async def _release(self) -> None:
        await self._stop_heartbeat()
        if self._superseded:
            return
        lock = self._lock
        # Past one validity without renewal the lock has expired anyway: a
        # release still stuck by then is pointless, so it is bounded by that.
        timeout = asyncio.timeout(lock.settings.validity)
        try:
            async with timeout:
                await retry(self._release_once, lock.retry_policy, on_retry=self._log_retry)
        except TimeoutError:
            if not timeout.expired():
                raise
            raise OutcomeUnknown(
                f"release of lock {self.name} did not finish within {lock.settings.validity:g}s; "
                "the lock expires on its own"
            ) from None

    def _log_retry(self, attempt: int, exc: BaseException) -> None:
        log.info("release of lock %s: attempt %d failed: %r", self.name, attempt, exc)

    async def _release_once(self) -> None:
        lock = self._lock
        nonce = _nonce()
        record = released_record(self._record, now=lock.clock(), nonce=nonce)
        self._pending[nonce] = lock.monotonic()
        try:
            info = await lock.store.write_if_match(lock.key, encode_record(record), self._version)
        except (PreconditionFailed, NotFound, OutcomeUnknown):
            try:
                current = await _observe(lock.store, lock.key)
            except _READ_AGAIN as exc:
                raise TransientError(f"could not re-read lock {self.name}: {exc!r}") from exc
            outcome = resolve_holder_write(
                current,
                owner=self.owner,
                epoch=self.epoch,
                known_version=self._version,
                nonces=self._pending,
            )
            if outcome is Resolution.SUPERSEDED:
                log.info("lock %s (epoch %d) was no longer ours at release", self.name, self.epoch)
                return
            if outcome is Resolution.OURS:
                assert current is not None
                self._confirm(current.record, current.version, self._pending[current.record.nonce])
                if current.record.released:
                    return
            raise TransientError(f"release of lock {self.name} did not land; trying again") from None
        self._confirm(record, info.version, 0.0)

    # -- guarding a block --------------------------------------------------------------

    async def __aenter__(self) -> HeldLease:
        """Guard the current task: it is cancelled at once if the lease is lost.

        Raises:
            LockLost: the lease is already lost or released (it is released).
            RuntimeError: the lease already guards a block.
        """
        if self._guard_used:
            raise RuntimeError("a lease guards one block only")
        self._guard_used = True
        self._guarded = asyncio.current_task()
        try:
            self.check()
        except LockLost:
            self._guarded = None
            await self.release()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the lease; turn our own cancellation of the block into LockLost.

        Raises:
            LockLost / Fenced: the lease was lost while the block ran (even if
                the block then finished on its own); chained from the block's
                own error if it raised something else.
            The block's own exception otherwise (returns None to re-raise it).
            CancelledError: the block was (also) cancelled from outside.
        """
        # No await before this point: the heartbeat cannot cancel us any more.
        task, self._guarded = self._guarded, None
        ours_cancelled = self._cancelled_guarded
        # A loss noticed only after the block ended does not concern the block.
        lost = self._lost_error
        outside_cancels = 0
        if ours_cancelled and task is not None:
            outside_cancels = task.uncancel()
        try:
            await self.release()
        except (TransientError, OutcomeUnknown) as rel_exc:
            # The work itself is done (or failed on its own); a release that
            # keeps failing only delays the next holder until expiry.
            log.warning("could not release lock %s: %r; it will expire", self.name, rel_exc)
        if lost is None:
            return
        if isinstance(exc, asyncio.CancelledError):
            if not ours_cancelled or outside_cancels > 0:
                return  # cancelled from outside: that cancellation propagates
            raise lost from None
        raise lost from exc


class StorageLock:
    """A named lock held as one object in an :class:`~shared.storage.ObjectStore`.

    One instance is one contender with one owner identity; it holds at most
    one lease at a time (not re-entrant). Use :meth:`hold` for a block of work,
    or :meth:`acquire` / :meth:`release` to hold a lock for long (leader
    election: watch :attr:`HeldLease.lost`).
    """

    def __init__(
        self,
        store: ObjectStore,
        name: str,
        *,
        owner: str | None = None,
        settings: LockSettings,
        clock: Clock = time.time,
        monotonic: Clock = time.monotonic,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """Prepare a contender for the lock ``name`` (no I/O).

        ``clock`` is the wall clock written into records and compared with
        other hosts' records; ``monotonic`` measures the local lease deadline.
        ``retry`` governs release (default: a few quick retries within one
        lock validity).

        Raises:
            BadInput: ``name`` is not a valid lock name.
            ConfigError: the settings leave no room for two renewals before
                the local deadline (``validity - max_drift < 2 * renew_interval``).
        """
        if settings.validity - settings.max_drift < 2 * settings.renew_interval:
            raise ConfigError(
                "lock.validity - lock.max_drift must be at least twice lock.renew_interval "
                f"(got validity={settings.validity:g}, max_drift={settings.max_drift:g}, "
                f"renew_interval={settings.renew_interval:g})"
            )
        self._store = store
        self._name = name
        self._key = lock_key(name)
        self._owner = owner or default_owner()
        self._settings = settings
        self._clock = clock
        self._monotonic = monotonic
        self._retry = retry or RetryPolicy(attempts=6, initial=0.05, maximum=1.0, budget=settings.validity)
        self._rng = rng or random.Random()
        self._lease: HeldLease | None = None

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._name

    @property
    def key(self) -> str:
        """The lock object's key in the store."""
        return self._key

    @property
    def owner(self) -> str:
        """This contender's owner identity."""
        return self._owner

    @property
    def store(self) -> ObjectStore:
        """The store the lock lives in."""
        return self._store

    @property
    def settings(self) -> LockSettings:
        """The lock's timing settings."""
        return self._settings

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry policy of release."""
        return self._retry

    @property
    def rng(self) -> random.Random:
        """The random source of backoff jitter."""
        return self._rng

    def clock(self) -> float:
        """Return the wall-clock time (Unix seconds)."""
        return self._clock()

    def monotonic(self) -> float:
        """Return the monotonic time (seconds)."""
        return self._monotonic()

    @property
    def lease(self) -> HeldLease | None:
        """The current unreleased lease of this contender, if any."""
        return self._lease

    def _forget(self, lease: HeldLease) -> None:
        if self._lease is lease:
            self._lease = None

    # -- acquisition ---------------------------------------------------------------------

    async def try_acquire(self) -> HeldLease | None:
        """Make one attempt to take the lock.

        Returns:
            The lease (heartbeat running) if the lock was free and the write
            won; None if someone holds it or won the race.

        Raises:
            RuntimeError: this contender already holds a lease.
            BadInput: the lock object is not a valid lock record.
            TransientError, OutcomeUnknown: the store failed and re-reading
                could not settle whether we got the lock.

        Cancellation: a claim write whose outcome is unknown is settled and
        released (shielded) before CancelledError propagates.
        """
        self._check_free()
        claims: dict[str, tuple[float, str | None]] = {}
        async with self._settle_claims(claims):
            result = await self._attempt(claims, tolerate_read_errors=False)
            if isinstance(result, HeldLease):
                return result
            if isinstance(result, BaseException):
                again = await self._attempt(claims, write=False, tolerate_read_errors=False)
                if isinstance(again, HeldLease):
                    return again
                if not isinstance(result, PreconditionFailed):
                    raise result
            return None

    async def acquire(self, timeout: float | None = None) -> HeldLease:  # noqa: ASYNC109
        """Wait for the lock and take it.

        Polls with jittered exponential backoff between ``poll_min`` and
        ``poll_max`` (never sleeping past the holder's expiry), for at most
        ``timeout`` seconds (default ``settings.acquire_timeout``; at least one
        attempt is made).

        Returns:
            The lease, with its heartbeat running. Release it with
            :meth:`HeldLease.release` (or :meth:`release`).

        Raises:
            LockTimeout: the lock was not free in time.
            RuntimeError: this contender already holds a lease.
            BadInput: the lock object is not a valid lock record.

        Cancellation: a claim write whose outcome is unknown is settled and
        released (shielded) before CancelledError propagates, so a cancelled
        acquire does not leave a lock behind.
        """
        self._check_free()
        budget = self._settings.acquire_timeout if timeout is None else timeout
        deadline = self.monotonic() + budget
        claims: dict[str, tuple[float, str | None]] = {}
        attempt = 0
        holder: LockRecord | None = None
        async with self._settle_claims(claims):
            while True:
                result = await self._attempt(claims)
                if isinstance(result, HeldLease):
                    return result
                until: float | None = None
                if isinstance(result, Wait):
                    until, holder = result.until, result.holder
                remaining = deadline - self.monotonic()
                if remaining <= 0:
                    who = f"held by {holder.owner} (epoch {holder.epoch})" if holder else "not free"
                    raise LockTimeout(f"lock {self._name} not acquired within {budget:g}s: {who}")
                delay = poll_delay(
                    attempt, now=self.clock(), until=until, settings=self._settings, rng=self._rng
                )
                attempt += 1
                await asyncio.sleep(min(delay, remaining))

    async def release(self) -> None:
        """Release the current lease, if any (see :meth:`HeldLease.release`)."""
        if self._lease is not None:
            await self._lease.release()

    @contextlib.asynccontextmanager
    async def hold(self, timeout: float | None = None) -> AsyncIterator[HeldLease]:  # noqa: ASYNC109
        """Hold the lock for the duration of a block: ``async with lock.hold() as lease:``.

        Acquires like :meth:`acquire`, renews while the block runs, and
        releases on the way out (shielded, whatever the block did).

        Raises:
            LockTimeout: not acquired within ``timeout``.
            LockLost / Fenced: the lease was lost; the block was cancelled at
                once (or had finished) and this replaces its CancelledError.
            CancelledError: the block was cancelled from outside (the lock is
                released first).
            Whatever the block raised otherwise.
        """
        lease = await self.acquire(timeout)
        async with lease:
            yield lease

    def _check_free(self) -> None:
        if self._lease is not None:
            raise RuntimeError(f"lock {self._name}: this contender already holds it (not re-entrant)")

    async def _attempt(
        self,
        claims: dict[str, tuple[float, str | None]],
        *,
        write: bool = True,
        tolerate_read_errors: bool = True,
    ) -> HeldLease | Wait | BaseException | None:
        """Read, decide, and (if free) write one claim.

        Returns the lease, the Wait decision, the error of a failed or
        ambiguous claim write (to be settled by the next read), or None when
        the read failed transiently or ``write`` is False and the lock is free.
        """
        try:
            observed = await _observe(self._store, self._key)
        except _READ_AGAIN as exc:
            if not tolerate_read_errors:
                raise
            log.debug("lock %s: read failed: %r", self._name, exc)
            return None
        decision = decide_acquire(
            observed, now=self.clock(), owner=self._owner, nonces=claims, settings=self._settings
        )
        if isinstance(decision, Wait):
            return decision
        if isinstance(decision, Ours):
            started, took_over_from = claims[decision.record.nonce]
            log.info("lock %s: a claim that reported failure had succeeded (ghost resolved)", self._name)
            return self._new_lease(decision.record, decision.version, started, took_over_from)
        if not write:
            return None
        return await self._claim(decision, claims)

    async def _claim(
        self, decision: Create | TakeOver, claims: dict[str, tuple[float, str | None]]
    ) -> HeldLease | BaseException:
        nonce = _nonce()
        started = self.monotonic()
        record = claim_record(
            decision, owner=self._owner, now=self.clock(), nonce=nonce, settings=self._settings
        )
        expired = isinstance(decision, TakeOver) and decision.reason == "expired"
        took_over_from = decision.previous.owner if isinstance(decision, TakeOver) and expired else None
        claims[nonce] = (started, took_over_from)
        data = encode_record(record)
        try:
            if isinstance(decision, TakeOver):
                info = await self._store.write_if_match(self._key, data, decision.version)
            else:
                info = await self._store.write_if_absent(self._key, data)
        except _AMBIGUOUS as exc:
            return exc
        return self._new_lease(record, info.version, started, took_over_from)

    def _new_lease(
        self, record: LockRecord, version: str, started: float, took_over_from: str | None
    ) -> HeldLease:
        if took_over_from is not None:
            log.warning(
                "lock %s taken over from %s (epoch %d)",
                self._name,
                took_over_from,
                record.epoch,
                extra={"lock": self._name, "owner": self._owner, "previous_owner": took_over_from},
            )
        lease = HeldLease(
            self, record=record, version=version, write_started=started, took_over_from=took_over_from
        )
        self._lease = lease
        lease._start()
        return lease

    @contextlib.asynccontextmanager
    async def _settle_claims(self, claims: dict[str, tuple[float, str | None]]) -> AsyncIterator[None]:
        """On any failure of an acquisition, release a claim of ours that may have landed."""
        try:
            yield
        except BaseException:
            if claims and self._lease is None:
                await run_shielded(self._abandon(claims))
            raise

    async def _abandon(self, claims: dict[str, tuple[float, str | None]]) -> None:
        try:
            observed = await _observe(self._store, self._key)
            if observed is None:
                return
            decision = decide_acquire(
                observed, now=self.clock(), owner=self._owner, nonces=claims, settings=self._settings
            )
            if not isinstance(decision, Ours):
                return
            record = released_record(decision.record, now=self.clock(), nonce=_nonce())
            await self._store.write_if_match(self._key, encode_record(record), decision.version)
            log.info("lock %s: released a claim that landed after the acquirer gave up", self._name)
        except (*_AMBIGUOUS, *_READ_AGAIN) as exc:
            log.warning("lock %s: could not settle an abandoned claim (%r); it will expire", self._name, exc)


__all__ = ["HeldLease", "StorageLock", "default_owner", "read_lock", "run_shielded"]
