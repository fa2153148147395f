"""Running a shard's work: one task per piece of work, in the shard runner's task group.

:meth:`SchedulingMixin._schedule` queues a piece of work (commit, abort,
recovery, clean-up, operator request) unless the same one is queued or under
way, and returns at once. The shard's dispatcher (:meth:`_dispatch`, a task
of the runner) starts queued work whenever one of the worker-wide in-flight
slots is free, in turn across jobs and one at a time per dataset
(:mod:`workers._work_queue`); each piece is tried again after each failure
that can pass (backoff up to 30 s) until it is done, the shard stops, or
another worker owns the shard. The shard's in-flight board shows each piece
meanwhile (queued, running, retrying).

Intake does not wait for slots: it reads on while work is queued, so a job
whose event named thousands of datasets does not keep the next job's events
unread until its own work is done. It pauses while the shard's queue holds
``worker.max_queued_work`` pieces or more (:meth:`_wait_room`): the queue,
and the memory it takes, stay bounded even when a producer floods the shard
with work.

Mixed into :class:`workers._shard.ShardRunner`, ahead of the intake mixin
(whose ``_schedule`` is a placeholder for this one); the work itself is
:meth:`workers._actions.ActionsMixin._do`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from shared import CommitfleetError, Fenced, LockLost, LockTimeout, OutcomeUnknown, TransientError
from shared._aio import raise_if_cancelling
from shared._logging import kv
from shared.fleet import ReportingTaskGroup

from ._actions import Recover, Work, work_key
from ._context import WorkerContext
from ._inflight import InFlight, InFlightBoard, WorkState, work_label
from ._work_queue import WorkQueue

log = logging.getLogger("workers.shard")


class QueuedWork:
    """A piece of work in the shard's queue: the work, its key, when it was scheduled."""

    __slots__ = ("dataset", "key", "since", "turn", "work")

    def __init__(self, work: Work, key: tuple[object, ...], since: float) -> None:
        self.work = work
        self.key = key
        self.since = since
        self.dataset = work.dataset
        # Recoveries belong to no job: they share one turn.
        self.turn = "" if isinstance(work, Recover) else work.job


class SchedulingMixin:
    """The part of a shard runner that queues its work and runs it as tasks."""

    ctx: WorkerContext
    shard: int
    stopping: asyncio.Event
    _running: set[tuple[object, ...]]  # work_key of each piece queued or running (not yet ended)
    _queue: WorkQueue[QueuedWork]
    _queue_changed: asyncio.Event  # set when work is queued, made ready, or taken
    _tasks: set[asyncio.Task[None]]
    _tg: ReportingTaskGroup  # the runner's task group
    board: InFlightBoard  # the shard's in-flight board (written behind, see _inflight)

    if TYPE_CHECKING:
        # Provided by ActionsMixin (declared for type checking only: a placeholder here would
        # hide it, as ShardRunner lists this mixin first).
        async def _do(self, work: Work) -> None: ...

    def _schedule(self, work: Work) -> None:
        """Queue ``work`` unless the same work is queued or under way; return at once."""
        key = work_key(work)
        if key in self._running:
            return
        self._running.add(key)
        item = QueuedWork(work, key, time.time())
        self._queue.add(item)
        # Until it starts (the board is written behind: work started at once never shows queued).
        self.board.put(work_label(key), self._flight(work, key, item.since, "queued"))
        self._queue_changed.set()

    def _has_room(self) -> bool:
        """Return whether intake may read more: the queue is shorter than ``worker.max_queued_work``."""
        return len(self._queue) < self.ctx.settings.worker.max_queued_work

    async def _wait_room(self, timeout: float) -> None:  # noqa: ASYNC109 - a tick, not a deadline
        """Return once the shard's queue is shorter than ``worker.max_queued_work`` (back-pressure),
        the shard is stopping, or ``timeout`` seconds have passed (the caller's tick is due)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not self._has_room() and not self.stopping.is_set():
                    self._queue_changed.clear()  # request_stop sets it too
                    await self._queue_changed.wait()

    async def _dispatch(self) -> None:
        """Start queued work as in-flight slots free up; never returns.

        Runs for the runner's life, through its drain too (the runner cancels
        it when the drain ends: see ``ShardRunner._drain``).

        Cancellation: ends the loop (a slot being waited for is not taken).
        """
        inflight = self.ctx.inflight
        while True:
            while not self._queue.ready:
                self._queue_changed.clear()
                await self._queue_changed.wait()
            await inflight.acquire()
            item = self._queue.take()
            if item is None:  # only this task takes: cannot happen, but never keep a slot
                inflight.release()
                continue
            self._queue_changed.set()  # the queue is shorter: intake may have room again
            try:
                task = self._tg.create_task(self._run_work(item))
            except RuntimeError:
                # The runner's task group is ending: give the slot back and end with it.
                self._ended(item)
                raise_if_cancelling()
                raise
            self._tasks.add(task)
            # A callback, not a ``finally`` in the task: a task cancelled before
            # it first runs (its group aborting on a sibling's Fenced) never
            # enters its coroutine, and its slot, shared by the whole worker,
            # would be gone for good.
            task.add_done_callback(functools.partial(self._work_done, item))

    def _work_done(self, item: QueuedWork, task: asyncio.Task[None]) -> None:
        """``item``'s task ended, however (even cancelled before it started): free what it held."""
        self._tasks.discard(task)
        # Not in flight here any more, whether done, left to the next owner or cancelled.
        self.board.drop(work_label(item.key))
        self._ended(item)

    def _ended(self, item: QueuedWork) -> None:
        """Forget ``item`` (its work ended or never started); free its slot; make the next work of its
        dataset ready."""
        self._running.discard(item.key)
        self._queue.done(item.dataset)
        self.ctx.inflight.release()
        self._queue_changed.set()  # the next work of the dataset may be ready; a drain may be over

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

    async def _run_work(self, item: QueuedWork) -> None:
        """Run ``item``'s work, keeping the shard's in-flight board up to date.

        Its slot is freed and its board entry dropped by :meth:`_work_done`
        when the task ends, whichever way.
        """
        await self._retrying(item.work, item.key, item.since)

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


__all__ = ["QueuedWork", "SchedulingMixin"]
