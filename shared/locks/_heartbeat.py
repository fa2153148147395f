"""A held lease's heartbeat: the task that renews the lock on time until it stops or is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Final

from .._aio import cancel_until_done
from .._errors import LockLost
from ._holding import Holding
from ._state import Resolution, poll_delay

# How often stopping cancels the heartbeat task again: on Python 3.11 one
# cancellation can be swallowed by a store call finishing at the same moment.
_RECANCEL_S: Final = 0.25


class Heartbeat:
    """Renews one :class:`Holding` on time, and reports its loss.

    The renewals run in a task of their own (:meth:`start`). Each renewal is
    due ``renew_interval`` after the last confirmed one; an unknown outcome is
    retried with jittered backoff; nothing waits past the local deadline. The
    loop ends when the holding is closing, or when it is lost: its local
    deadline passed, or a renewal found the lock taken (the holding is then
    marked superseded). A loss is reported through ``on_lost`` (also when the
    loop itself fails: work must not go on unprotected), after which the task
    runs ``after_loss()`` (the lease's enforcement) before it ends.
    """

    def __init__(
        self,
        holding: Holding,
        *,
        on_lost: Callable[[LockLost], None],
        after_loss: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        self._holding = holding
        self._on_lost = on_lost
        self._after_loss = after_loss
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the renewals (in a task of their own, on the running loop)."""
        h = self._holding.handle
        self._task = asyncio.create_task(
            self._run(), name=f"lock-heartbeat:{h.name}:{self._holding.record.epoch}"
        )

    async def stop(self) -> None:
        """Stop the renewals and wait until the task has ended (once; later calls return at once).

        Raises:
            Whatever the heartbeat task failed with (a bug, already reported as
            a loss).

        Cancelled: stops waiting (the task has been asked to stop); the
        caller's CancelledError is never confused with the task's own.
        """
        task, self._task = self._task, None
        if task is None:
            return
        # Cancel until it has ended: a heartbeat left running would renew a
        # released lease forever (the loop also stops on ``holding.closing``).
        await cancel_until_done(task, every_s=_RECANCEL_S)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error

    async def _run(self) -> None:
        try:
            await self._beat()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # A bug in the heartbeat must not leave the work running unprotected.
            self._on_lost(LockLost(f"heartbeat of lock {self._holding.handle.name} failed: {exc!r}"))
            raise
        await self._after_loss()

    async def _beat(self) -> None:
        holding = self._holding
        name = holding.handle.name
        s = holding.handle.settings
        mono = holding.handle.monotonic
        failures = 0
        while not holding.closing:
            if failures == 0:
                delay = holding.renewed_at() + s.renew_interval - mono()
            else:
                delay = poll_delay(failures - 1, now=0.0, until=None, settings=s, rng=holding.handle.rng)
            await asyncio.sleep(max(0.0, min(delay, holding.deadline - mono())))
            if mono() >= holding.deadline:
                self._on_lost(LockLost(f"lock {name} ran out locally before a renewal got through"))
                return
            timeout = asyncio.timeout(holding.deadline - mono())
            try:
                async with timeout:
                    outcome = await holding.renew_once()
            except TimeoutError:
                if not timeout.expired():
                    raise
                self._on_lost(LockLost(f"lock {name} ran out locally while renewing"))
                return
            if outcome is Resolution.OURS:
                failures = 0
            elif outcome is Resolution.UNCHANGED:
                failures += 1
            else:
                holding.superseded = True
                self._on_lost(holding.loss_reason("renewal refused"))
                return


__all__ = ["Heartbeat"]
