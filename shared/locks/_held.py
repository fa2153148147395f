"""One holding of a storage lock: heartbeat, loss, release, and the guard of a block (``async with lease``).

A lease that is lost (renewal refused, or its local deadline passed before a
renewal got through) sets :attr:`HeldLease.lost`; when the lease guards a block
that block's task is cancelled at once (and again until it leaves) and the
block ends with :class:`LockLost`, as does a block that ends past the lease's
local deadline. The renewals themselves (the heartbeat's loop) are in
:mod:`._renew`.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import TYPE_CHECKING, Final

from .._aio import cancel_until_done, run_shielded
from .._errors import Fenced, LockLost, NotFound, OutcomeUnknown, PreconditionFailed, TransientError
from .._retry import retry
from ._io import READ_AGAIN, RELEASES, SEEN, new_nonce, observe
from ._renew import Renewals
from ._state import (
    LockRecord,
    Observed,
    Resolution,
    encode_record,
    local_deadline,
    released_record,
)

if TYPE_CHECKING:
    from ._lock import StorageLock

log = logging.getLogger("shared.locks")

# How often a lost lease cancels its block again while the block goes on: on
# Python 3.11 a cancellation can be swallowed (``asyncio.wait_for`` returning a
# result that landed at the same moment, a TaskGroup whose child failed), and
# the block must not run on unprotected because of that.
_ENFORCE_S: Final = 0.25


class HeldLease(Renewals):
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
        SEEN.put(lock.store, lock.key, Observed(record=record, version=version))
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
        # Cancellation requests this lease made of its block, and the block
        # task's count of them when the block began (a count left behind
        # earlier, e.g. by Python 3.11's TaskGroup, is not an outside request).
        self._cancels_sent = 0
        self._entry_cancelling = 0
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
        await self._enforce()

    async def _enforce(self) -> None:
        """After a loss: cancel the guarded block again until it has left (see ``_ENFORCE_S``)."""
        while self._lost_error is not None and not self._closing:
            task = self._guarded
            if task is None or task.done():
                return
            await asyncio.sleep(_ENFORCE_S)
            if self._guarded is task and not task.done():
                log.warning("lock %s lost but its block goes on; cancelling it again", self.name)
                self._cancel_guarded(task)

    def _cancel_guarded(self, task: asyncio.Task[object]) -> None:
        self._cancels_sent += 1
        task.cancel(msg=self._cancel_msg)

    @property
    def _cancel_msg(self) -> str:
        return f"lock {self.name} (epoch {self.epoch}) lost"

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
            self._cancel_guarded(task)

    def _confirm(self, record: LockRecord, version: str, started: float) -> None:
        self._record = record
        self._version = version
        SEEN.put(self._lock.store, self._lock.key, Observed(record=record, version=version))
        self._pending.clear()
        if record.released:
            # Waiters in this process take it over now, not at their next poll.
            RELEASES.notify(self._lock.store, self._lock.key)
        else:
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
        # Cancel until it has ended: on Python 3.11 one cancellation can be
        # swallowed by a store call finishing at the same moment, and a
        # heartbeat left running would renew a released lease forever (the
        # loop also stops on ``_closing``). cancel_until_done never raises the
        # task's CancelledError into us, so an outside cancellation of the
        # caller stays distinguishable.
        await cancel_until_done(hb, every_s=_ENFORCE_S)
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
                if lock.notifier is not None:
                    # Waiters in other processes look now rather than at their next poll.
                    await lock.notifier.released(lock.name)
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
        nonce = new_nonce()
        record = released_record(self._record, now=lock.clock(), nonce=nonce)
        self._pending[nonce] = lock.monotonic()
        try:
            info = await lock.store.write_if_match(lock.key, encode_record(record), self._version)
        except (PreconditionFailed, NotFound, OutcomeUnknown):
            try:
                current = await observe(lock.store, lock.key)
            except READ_AGAIN as exc:
                raise TransientError(f"could not re-read lock {self.name}: {exc!r}") from exc
            outcome = self._judge_seen(current)
            if outcome is Resolution.SUPERSEDED:
                log.info("lock %s (epoch %d) was no longer ours at release", self.name, self.epoch)
                return
            if outcome is Resolution.OURS and current is not None and current.record.released:
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
        if self._guarded is not None:
            self._entry_cancelling = self._guarded.cancelling()
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
                the block then finished on its own), or the block ended after
                the lease's local deadline (a frozen or starved holder: a
                successor may hold the lock already, even though no renewal
                was refused yet); chained from the block's own error if it
                raised something else.
            The block's own exception otherwise (returns None to re-raise it).
            CancelledError: the block was (also) cancelled from outside.
        """
        # No await before this point: the heartbeat cannot cancel us any more.
        task, self._guarded = self._guarded, None
        cancels, self._cancels_sent = self._cancels_sent, 0
        if self._lost_error is None and not self._released and self._lock.monotonic() >= self._deadline:
            self._mark_lost(LockLost(f"lock {self.name} (epoch {self.epoch}): the block outlived its lease"))
        lost = self._lost_error
        outside_cancels = 0
        if cancels and task is not None:
            for _ in range(cancels):
                task.uncancel()
            outside_cancels = task.cancelling() - self._entry_cancelling
        try:
            await self.release()
        except (TransientError, OutcomeUnknown) as rel_exc:
            # The work itself is done (or failed on its own); a release that
            # keeps failing only delays the next holder until expiry.
            log.warning("could not release lock %s: %r; it will expire", self.name, rel_exc)
        if lost is None:
            return
        if isinstance(exc, asyncio.CancelledError):
            ours = cancels > 0 and (outside_cancels <= 0 or exc.args == (self._cancel_msg,))
            if not ours:
                return  # cancelled from outside: that cancellation propagates
            raise lost from None
        raise lost from exc


__all__ = ["HeldLease"]
