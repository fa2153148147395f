"""Running a shard's work: one task per piece of work, in the shard runner's task group.

:meth:`SchedulingMixin._schedule` starts a piece of work (commit, abort,
recovery, clean-up, operator request) unless the same one is under way. It
waits for one of the worker-wide in-flight slots (intake waits with it:
back-pressure); the work then runs one at a time per dataset, and is tried
again after each failure that can pass (backoff up to 30 s) until it is done,
the shard stops, or another worker owns the shard. The shard's in-flight
board shows each piece meanwhile (queued, running, retrying).

Mixed into :class:`workers._shard.ShardRunner`, ahead of the intake mixin
(whose ``_schedule`` is a placeholder for this one); the work itself is
:meth:`workers._actions.ActionsMixin._do`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from shared import CommitfleetError, Fenced, LockLost, LockTimeout, OutcomeUnknown, TransientError
from shared._aio import raise_if_cancelling
from shared._logging import kv
from shared.fleet import ReportingTaskGroup

from ._actions import Work, work_key
from ._context import WorkerContext
from ._ds_locks import DatasetLocks
from ._inflight import InFlight, InFlightBoard, WorkState, work_label

log = logging.getLogger("workers.shard")


class SchedulingMixin:
    """The part of a shard runner that runs its work as tasks."""

    ctx: WorkerContext
    shard: int
    stopping: asyncio.Event
    _running: set[tuple[object, ...]]  # work_key of each piece scheduled and not yet ended
    _ds_locks: DatasetLocks
    _tasks: set[asyncio.Task[None]]
    _tg: ReportingTaskGroup  # the running session's task group
    board: InFlightBoard  # the shard's in-flight board (written behind, see _inflight)

    if TYPE_CHECKING:
        # Provided by ActionsMixin (declared for type checking only: a placeholder here would
        # hide it, as ShardRunner lists this mixin first).
        async def _do(self, work: Work) -> None: ...

    async def _schedule(self, work: Work) -> None:
        key = work_key(work)
        if key in self._running:
            return
        since = time.time()
        if self.ctx.inflight.locked():
            # Every worker-wide slot is taken: show that this work waits for one.
            self.board.put(work_label(key), self._flight(work, key, since, "queued"))
        await self.ctx.inflight.acquire()
        try:
            task = self._tg.create_task(self._run_work(work, key, since))
        except RuntimeError:
            # The session's task group is ending (a sibling failed, or the shard stops)
            # between our last await and here: give the slot back and end with it.
            self.ctx.inflight.release()
            raise_if_cancelling()
            raise
        self._running.add(key)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _flight(
        self, work: Work, key: tuple[object, ...], since: float, state: WorkState, **kw: Any
    ) -> InFlight:
        return InFlight(
            work=str(key[0]).lower(),
            dataset=work.dataset,
            job=getattr(work, "job", ""),
            worker=self.ctx.worker_id,
            state=state,
            since=since,
            state_since=time.time(),
            **kw,
        )

    async def _run_work(self, work: Work, key: tuple[object, ...], since: float) -> None:
        """Run ``work`` (one at a time per dataset), keeping the shard's in-flight board up to date."""
        label = work_label(key)
        try:
            if self._ds_locks.busy(work.dataset):
                self.board.put(label, self._flight(work, key, since, "queued"))
            async with self._ds_locks.hold(work.dataset):
                await self._retrying(work, key, since)
            self.board.drop(label)
        finally:
            self._running.discard(key)
            self.ctx.inflight.release()

    async def _retrying(self, work: Work, key: tuple[object, ...], since: float) -> None:
        """Run ``work`` until it is done, the shard stops, or another worker owns the shard.

        Every way an attempt can end early leads to another attempt (after a
        backoff up to 30 s) unless the shard is stopping: our errors, a lost
        lock, and also a CancelledError that nobody asked for (the task has no
        cancellation request pending and the shard is not stopping; Python
        3.11 can surface one after a TaskGroup inside the work lost a child):
        such work used to end silently and leave its dataset in flight on a
        live owner for good.

        Raises:
            Fenced: another worker owns the shard.
            CancelledError: the runner is being cancelled (drain or shutdown).
        """
        delay = 0.2
        attempts = 0
        error = ""
        label = work_label(key)
        while True:
            attempts += 1
            running = self._flight(work, key, since, "running", attempts=attempts, last_error=error[:500])
            self.board.put(label, running)
            try:
                await self._do(work)
                return
            except Fenced:
                raise
            except (TransientError, LockTimeout, LockLost, OutcomeUnknown) as exc:
                error = f"{type(exc).__name__}: {exc}"
                if self.stopping.is_set():
                    log.info("leaving work to the next owner", extra=kv(work=repr(work), error=str(exc)))
                    return
                log.warning("work interrupted, retrying", extra=kv(work=repr(work), error=str(exc)))
            except CommitfleetError as exc:
                # Not expected here (the commit core quarantines what keeps
                # failing); keep the dataset waiting, never stop the shard.
                error = f"{type(exc).__name__}: {exc}"
                log.exception("work failed, retrying later", extra=kv(work=repr(work), error=repr(exc)))
                delay = max(delay, 5.0)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self.stopping.is_set() or task is None or task.cancelling() > 0:
                    raise
                error = "CancelledError that nobody requested"
                log.exception(
                    "work ended by a cancellation nobody requested; retrying", extra=kv(work=repr(work))
                )
            if self.stopping.is_set():
                return
            retry_at = time.time() + delay
            self.board.put(
                label,
                self._flight(
                    work,
                    key,
                    since,
                    "retrying",
                    attempts=attempts,
                    last_error=error[:500],
                    next_attempt_at=retry_at,
                ),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
            delay = min(delay * 2, 30.0)


__all__ = ["SchedulingMixin"]
