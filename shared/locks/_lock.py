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
block's task is cancelled at once and the block ends with :class:`LockLost`
(see ``_held.py``). This module holds the contender, :class:`StorageLock`: it
makes a :class:`~._holding.LockHandle` once, and a :class:`HeldLease` on each
claim that wins, given that handle and a callback for when it is released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator

from .._aio import run_shielded
from .._errors import (
    ConfigError,
    LockTimeout,
    PreconditionFailed,
)
from .._retry import RetryPolicy
from ..settings import LockSettings
from ..storage import ObjectStore
from ._held import HeldLease
from ._holding import LockHandle
from ._io import (
    AMBIGUOUS,
    READ_AGAIN,
    RELEASES,
    SEEN,
    Clock,
    default_owner,
    new_nonce,
    observe,
    wait_for_release,
)
from ._notify import ReleaseNotifier
from ._state import (
    Create,
    LockRecord,
    Ours,
    TakeOver,
    Wait,
    claim_record,
    decide_acquire,
    encode_record,
    lock_key,
    poll_delay,
    released_record,
)

log = logging.getLogger("shared.locks")

# The jitter of every lock without an rng of its own: one generator per process
# (seeding one takes 2.5 KB from os.urandom, once per lock object before),
# seeded again in a forked child so that parent and child do not poll in step.
_RNG = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RNG.seed)


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
        notifier: ReleaseNotifier | None = None,
    ) -> None:
        """Prepare a contender for the lock ``name`` (no I/O).

        ``clock`` is the wall clock written into records and compared with
        other hosts' records; ``monotonic`` measures the local lease deadline.
        ``retry`` governs release (default: a few quick retries within one
        lock validity). ``notifier`` (optional, e.g. Redis pub/sub) tells
        waiters in other processes about releases and wakes this one's waits.

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
        self._handle = LockHandle(
            store=store,
            name=name,
            key=lock_key(name),
            settings=settings,
            clock=clock,
            monotonic=monotonic,
            retry=retry or RetryPolicy(attempts=6, initial=0.05, maximum=1.0, budget=settings.validity),
            rng=rng or _RNG,
            notifier=notifier,
        )
        self._owner = owner or default_owner()
        self._lease: HeldLease | None = None

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._handle.name

    @property
    def key(self) -> str:
        """The lock object's key in the store."""
        return self._handle.key

    @property
    def owner(self) -> str:
        """This contender's owner identity."""
        return self._owner

    @property
    def store(self) -> ObjectStore:
        """The store the lock lives in."""
        return self._handle.store

    @property
    def settings(self) -> LockSettings:
        """The lock's timing settings."""
        return self._handle.settings

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry policy of release."""
        return self._handle.retry

    @property
    def rng(self) -> random.Random:
        """The random source of backoff jitter."""
        return self._handle.rng

    def clock(self) -> float:
        """Return the wall-clock time (Unix seconds)."""
        return self._handle.clock()

    def monotonic(self) -> float:
        """Return the monotonic time (seconds)."""
        return self._handle.monotonic()

    @property
    def notifier(self) -> ReleaseNotifier | None:
        """The cross-process release notifier, if any."""
        return self._handle.notifier

    @property
    def lease(self) -> HeldLease | None:
        """The current unreleased lease of this contender, if any."""
        return self._lease

    def _released(self, lease: HeldLease) -> None:
        """The lease's on-release callback: this contender may take a new lease."""
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
            result = await self._attempt(claims, tolerate_read_errors=False, guess=True, write_again=False)
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
        budget = self._handle.settings.acquire_timeout if timeout is None else timeout
        deadline = self.monotonic() + budget
        claims: dict[str, tuple[float, str | None]] = {}
        attempt = 0
        holder: LockRecord | None = None
        woken = False
        async with self._settle_claims(claims):
            with RELEASES.watch(self._handle.store, self._handle.key) as released:
                notifier = self._handle.notifier
                notices = (
                    notifier.watch(self._handle.name, released)
                    if notifier is not None
                    else contextlib.nullcontext()
                )
                async with notices:
                    while True:
                        released.clear()
                        # Woken by a release in this process: its record is what we saw last,
                        # so the claim goes on it at once (a refused guess reads, as always).
                        result = await self._attempt(claims, guess=attempt == 0 or woken)
                        if isinstance(result, HeldLease):
                            return result
                        until: float | None = None
                        if isinstance(result, Wait):
                            until, holder = result.until, result.holder
                        remaining = deadline - self.monotonic()
                        if remaining <= 0:
                            who = f"held by {holder.owner} (epoch {holder.epoch})" if holder else "not free"
                            raise LockTimeout(
                                f"lock {self._handle.name} not acquired within {budget:g}s: {who}"
                            )
                        delay = poll_delay(
                            attempt,
                            now=self.clock(),
                            until=until,
                            settings=self._handle.settings,
                            rng=self.rng,
                        )
                        attempt += 1
                        woken = await wait_for_release(released, min(delay, remaining))

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
                once (or had finished) and this replaces its CancelledError;
                also when the block ended past the lease's local deadline.
            CancelledError: the block was cancelled from outside (the lock is
                released first).
            Whatever the block raised otherwise.
        """
        lease = await self.acquire(timeout)
        async with lease:
            yield lease

    def _check_free(self) -> None:
        if self._lease is not None:
            raise RuntimeError(f"lock {self._handle.name}: this contender already holds it (not re-entrant)")

    async def _attempt(
        self,
        claims: dict[str, tuple[float, str | None]],
        *,
        write: bool = True,
        tolerate_read_errors: bool = True,
        guess: bool = False,
        write_again: bool = True,
    ) -> HeldLease | Wait | BaseException | None:
        """Read, decide, and (if free) write one claim.

        Returns the lease, the Wait decision, the error of a failed or
        ambiguous claim write (to be settled by the next read), or None when
        the read failed transiently or ``write`` is False and the lock is free.

        With ``guess``, the read is skipped when this process's last sight of
        the lock (:class:`~._io.SeenLocks`) shows it free, or when it never
        saw it: the claim goes on that version (or create-if-absent) at once.
        A refused or ambiguous guessed claim falls through to the read, which
        also settles whether it landed (and claims again only with
        ``write_again``; else the claim's error is returned).
        """
        if guess and write:
            seen = SEEN.get(self._handle.store, self._handle.key)
            guessed = (
                Create()
                if seen is None
                else decide_acquire(
                    seen, now=self.clock(), owner=self._owner, nonces=claims, settings=self._handle.settings
                )
            )
            if isinstance(guessed, Create | TakeOver):
                won = await self._claim(guessed, claims)
                if isinstance(won, HeldLease):
                    return won
                SEEN.forget(self._handle.store, self._handle.key)
                if not write_again:
                    return won  # one claim per attempt: the caller reads (and settles) next
        try:
            observed = await observe(self._handle.store, self._handle.key)
        except READ_AGAIN as exc:
            if not tolerate_read_errors:
                raise
            log.debug("lock %s: read failed: %r", self._handle.name, exc)
            return None
        decision = decide_acquire(
            observed, now=self.clock(), owner=self._owner, nonces=claims, settings=self._handle.settings
        )
        if isinstance(decision, Wait):
            return decision
        if isinstance(decision, Ours):
            started, took_over_from = claims[decision.record.nonce]
            log.info(
                "lock %s: a claim that reported failure had succeeded (ghost resolved)", self._handle.name
            )
            return self._new_lease(decision.record, decision.version, started, took_over_from)
        if not write:
            return None
        return await self._claim(decision, claims)

    async def _claim(
        self, decision: Create | TakeOver, claims: dict[str, tuple[float, str | None]]
    ) -> HeldLease | BaseException:
        nonce = new_nonce()
        started = self.monotonic()
        record = claim_record(
            decision, owner=self._owner, now=self.clock(), nonce=nonce, settings=self._handle.settings
        )
        expired = isinstance(decision, TakeOver) and decision.reason == "expired"
        took_over_from = decision.previous.owner if isinstance(decision, TakeOver) and expired else None
        claims[nonce] = (started, took_over_from)
        data = encode_record(record)
        try:
            if isinstance(decision, TakeOver):
                info = await self._handle.store.write_if_match(self._handle.key, data, decision.version)
            else:
                info = await self._handle.store.write_if_absent(self._handle.key, data)
        except AMBIGUOUS as exc:
            return exc
        return self._new_lease(record, info.version, started, took_over_from)

    def _new_lease(
        self, record: LockRecord, version: str, started: float, took_over_from: str | None
    ) -> HeldLease:
        if took_over_from is not None:
            log.warning(
                "lock %s taken over from %s (epoch %d)",
                self._handle.name,
                took_over_from,
                record.epoch,
                extra={"lock": self._handle.name, "owner": self._owner, "previous_owner": took_over_from},
            )
        lease = HeldLease(
            self._handle,
            record=record,
            version=version,
            write_started=started,
            took_over_from=took_over_from,
            on_release=self._released,
        )
        self._lease = lease
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
            observed = await observe(self._handle.store, self._handle.key)
            if observed is None:
                return
            decision = decide_acquire(
                observed, now=self.clock(), owner=self._owner, nonces=claims, settings=self._handle.settings
            )
            if not isinstance(decision, Ours):
                return
            record = released_record(decision.record, now=self.clock(), nonce=new_nonce())
            await self._handle.store.write_if_match(self._handle.key, encode_record(record), decision.version)
            log.info("lock %s: released a claim that landed after the acquirer gave up", self._handle.name)
        except (*AMBIGUOUS, *READ_AGAIN) as exc:
            log.warning(
                "lock %s: could not settle an abandoned claim (%r); it will expire", self._handle.name, exc
            )


__all__ = ["StorageLock"]
