"""One holding of a storage lock: heartbeat, loss, release, and the guard of a block (``async with lease``).

A lease that is lost (renewal refused, or its local deadline passed before a
renewal got through) sets :attr:`HeldLease.lost`; when the lease guards a block
that block's task is cancelled at once (and again until it leaves) and the
block ends with :class:`LockLost`, as does a block that ends past the lease's
local deadline. A lease is composed of its :class:`~._holding.Holding` (the
record it last wrote and the writes on it) and its :class:`~._heartbeat.Heartbeat`
(the renewals); it knows nothing of the lock that made it but the handle and
the callback that lock gave it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Final

from .._aio import run_shielded
from .._errors import LockLost, OutcomeUnknown, TransientError
from .._retry import retry
from ._heartbeat import Heartbeat
from ._holding import Holding, LockHandle
from ._state import LockRecord

log = logging.getLogger("shared.locks")

# How often a lost lease cancels its block again while the block goes on: on
# Python 3.11 a cancellation can be swallowed (``asyncio.wait_for`` returning a
# result that landed at the same moment, a TaskGroup whose child failed), and
# the block must not run on unprotected because of that.
_ENFORCE_S: Final = 0.25


class HeldLease:
    """One holding of a :class:`StorageLock` (implements :class:`~shared.locks.Lease`).

    Created by :meth:`StorageLock.acquire` / :meth:`StorageLock.try_acquire`
    with its heartbeat already running; the lease owns the heartbeat and
    :meth:`release` stops it. ``async with lease:`` guards a block: if the
    lease is lost, the block's task is cancelled and the block ends with
    :class:`LockLost` (or :class:`Fenced` when a newer holder was seen); the
    lease is released on the way out in every case.
    """

    def __init__(
        self,
        handle: LockHandle,
        *,
        record: LockRecord,
        version: str,
        write_started: float,
        took_over_from: str | None,
        on_release: Callable[[HeldLease], None],
    ) -> None:
        """Take over the claim that won (``record`` at ``version``, sent at ``write_started``) and
        start its heartbeat (call from a running event loop).

        ``on_release`` is called with this lease once its release has ended
        (whatever the outcome), so its lock can take a new one.
        """
        self._handle = handle
        self._holding = Holding(handle, record=record, version=version, write_started=write_started)
        self._took_over_from = took_over_from
        self._on_release = on_release
        self._lost = asyncio.Event()
        self._lost_error: LockLost | None = None
        self._released = False
        self._guarded: asyncio.Task[object] | None = None
        self._guard_used = False
        # Cancellation requests this lease made of its block, and the block
        # task's count of them when the block began (a count left behind
        # earlier, e.g. by Python 3.11's TaskGroup, is not an outside request).
        self._cancels_sent = 0
        self._entry_cancelling = 0
        self._heartbeat = Heartbeat(self._holding, on_lost=self._mark_lost, after_loss=self._enforce)
        self._heartbeat.start()

    # -- the Lease protocol -----------------------------------------------------------

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._handle.name

    @property
    def epoch(self) -> int:
        """The fencing epoch of this holding."""
        return self._holding.record.epoch

    def check(self) -> None:
        """Return if the lease is still valid locally; raise otherwise.

        Raises:
            Fenced: a newer holder took the lock over.
            LockLost: the lease was released, a renewal was refused, or the
                local deadline (last renewal sent + validity - max_drift) passed.
        """
        if self._lost_error is not None:
            raise self._lost_error
        if self._released or self._holding.closing:
            raise LockLost(f"lock {self.name} (epoch {self.epoch}) was released")
        if self._handle.monotonic() >= self._holding.deadline:
            raise LockLost(f"lock {self.name} (epoch {self.epoch}) ran out locally before a renewal")

    # -- more about the holding ---------------------------------------------------------

    @property
    def owner(self) -> str:
        """The owner identity written in the lock object."""
        return self._holding.record.owner

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
        return self._holding.record

    @property
    def deadline(self) -> float:
        """The monotonic instant until which the lease is valid locally."""
        return self._holding.deadline

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has finished."""
        return self._released

    # -- loss ------------------------------------------------------------------------------

    async def _enforce(self) -> None:
        """After a loss: cancel the guarded block again until it has left (see ``_ENFORCE_S``)."""
        while self._lost_error is not None and not self._holding.closing:
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
        if self._released or self._holding.closing:
            return
        self._holding.closing = True
        try:
            await run_shielded(self._release())
        finally:
            self._released = True
            self._on_release(self)

    async def _release(self) -> None:
        await self._heartbeat.stop()
        if self._holding.superseded:
            return
        h = self._handle
        # Past one validity without renewal the lock has expired anyway: a
        # release still stuck by then is pointless, so it is bounded by that.
        timeout = asyncio.timeout(h.settings.validity)
        try:
            async with timeout:
                await retry(self._holding.release_once, h.retry, on_retry=self._log_retry)
                if h.notifier is not None:
                    # Waiters in other processes look now rather than at their next poll.
                    await h.notifier.released(h.name)
        except TimeoutError:
            if not timeout.expired():
                raise
            raise OutcomeUnknown(
                f"release of lock {self.name} did not finish within {h.settings.validity:g}s; "
                "the lock expires on its own"
            ) from None

    def _log_retry(self, attempt: int, exc: BaseException) -> None:
        log.info("release of lock %s: attempt %d failed: %r", self.name, attempt, exc)

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
        if (
            self._lost_error is None
            and not self._released
            and self._handle.monotonic() >= self._holding.deadline
        ):
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
