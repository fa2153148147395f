"""Running a shard's work: one task per piece of work, in the shard runner's task group.

:meth:`Scheduler.schedule` queues a piece of work (commit, abort, recovery,
clean-up, operator request) unless the same one is queued or under way, and
returns at once. The shard's dispatcher (:meth:`Scheduler.dispatch`, a task
of the runner) starts queued work whenever one of the worker-wide in-flight
slots is free, in turn across jobs and one at a time per dataset
(:mod:`workers._core._work_queue`); each piece is tried again after each
failure that can pass (backoff up to 30 s) until it is done, the shard stops,
or another worker owns the shard. The shard's in-flight board shows each
piece meanwhile (queued, running, retrying).

Intake does not wait for slots: it reads on while work is queued, so a job
whose event named thousands of datasets does not keep the next job's events
unread until its own work is done. It pauses while the shard's queue holds
``worker.max_queued_work`` pieces or more (:meth:`Scheduler.wait_room`): the
queue, and the memory it takes, stay bounded even when a producer floods the
shard with work.

The scheduler is given what runs a piece of work (``do``: the runner routes
it to its actions or its operator requests), the worker-wide slots, the
shard's board and its stop event; it owns the queue, the set of work queued
or running, and the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from shared import (
    CommitfleetError,
    Fenced,
    LockLost,
    LockTimeout,
    OutcomeUnknown,
    TransientError,
    cancel_until_done,
    kv,
    raise_if_cancelling,
)
from shared.fleet import ReportingTaskGroup

from ._core import QueuedWork, Work, WorkQueue, work_key
from ._inflight import InFlight, InFlightBoard, WorkState, work_label

log = logging.getLogger("workers.shard")


class Scheduler:
    """Queues a shard's work and runs each piece as a task (see the module doc)."""

    def __init__(
        self,
        *,
        do: Callable[[Work], Awaitable[None]],
        inflight: asyncio.Semaphore,
        max_queued: int,
        worker_id: str,
        board: InFlightBoard,
        stopping: asyncio.Event,
    ) -> None:
        """``do`` runs one piece of work (once; raising to be retried); ``inflight`` is the
        worker-wide slots; ``max_queued`` the queue length at which intake pauses; ``board``
        the shard's in-flight board; ``stopping`` is set when the shard stops (read only)."""
        self._do = do
        self._inflight = inflight
        self._max_queued = max_queued
        self._worker_id = worker_id
        self._board = board
        self._stopping = stopping
        self.running: set[tuple[object, ...]] = set()  # work_key of each piece queued or running
        self.queue: WorkQueue[QueuedWork] = WorkQueue()
        self.tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()  # set when work is queued, made ready, or taken

    def wake(self) -> None:
        """Wake whoever waits on the queue (an intake paused for room, a drain): the shard stops."""
        self._changed.set()

    def schedule(self, work: Work) -> None:
        """Queue ``work`` unless the same work is queued or under way; return at once."""
        key = work_key(work)
        if key in self.running:
            return
        self.running.add(key)
        item = QueuedWork(work, key, time.time())
        self.queue.add(item)
        # Queued work is not written to the board: a commit or abort due that the board does not
        # show running is queued, so the board stays bounded by the slots (what the status reads),
        # not by the work a job_finished queues at once (10,000 datasets: a 2 MB status).
        self._changed.set()

    def has_room(self) -> bool:
        """Return whether intake may read more: the queue is shorter than ``worker.max_queued_work``."""
        return len(self.queue) < self._max_queued

    async def wait_room(self, timeout: float) -> None:  # noqa: ASYNC109 - a tick, not a deadline
        """Return once the shard's queue is shorter than ``worker.max_queued_work`` (back-pressure),
        the shard is stopping, or ``timeout`` seconds have passed (the caller's tick is due)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not self.has_room() and not self._stopping.is_set():
                    self._changed.clear()  # wake() (the shard stopping) sets it too
                    await self._changed.wait()

    async def dispatch(self, tg: ReportingTaskGroup) -> None:
        """Start queued work as in-flight slots free up; never returns.

        Runs for the runner's life, through its drain too (the runner cancels
        it when the drain ends: see ``ShardRunner._drain``).

        Cancellation: ends the loop (a slot being waited for is not taken).
        """
        inflight = self._inflight
        while True:
            while not self.queue.ready:
                self._changed.clear()
                await self._changed.wait()
            await inflight.acquire()
            item = self.queue.take()
            if item is None:  # only this task takes: cannot happen, but never keep a slot
                inflight.release()
                continue
            self._changed.set()  # the queue is shorter: intake may have room again
            try:
                task = tg.create_task(self._run_work(item))
            except RuntimeError:
                # The runner's task group is ending: give the slot back and end with it.
                self._ended(item)
                raise_if_cancelling()
                raise
            self.tasks.add(task)
            # A callback, not a ``finally`` in the task: a task cancelled before
            # it first runs (its group aborting on a sibling's Fenced) never
            # enters its coroutine, and its slot, shared by the whole worker,
            # would be gone for good.
            task.add_done_callback(functools.partial(self._work_done, item))

    async def settle(self, grace: float) -> None:
        """Return once no work is queued or running (the dispatcher goes on meanwhile), or after
        ``grace`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                while self.queue.datasets:
                    self._changed.clear()
                    await self._changed.wait()

    async def cancel_running(self) -> None:
        """Cancel every work task and return once each has ended (the dispatcher must be ended first).

        Each releases its lock on the way out; an interrupted commit's WAL stays for the next owner.
        """
        await asyncio.gather(*(cancel_until_done(t) for t in list(self.tasks) if not t.done()))

    def forget_queued(self) -> None:
        """Drop the work still queued (left to the next owner), from the queue and the board."""
        for item in self.queue.clear():
            self.running.discard(item.key)
            self._board.drop(work_label(item.key))

    def _work_done(self, item: QueuedWork, task: asyncio.Task[None]) -> None:
        """``item``'s task ended, however (even cancelled before it started): free what it held."""
        self.tasks.discard(task)
        # Not in flight here any more, whether done, left to the next owner or cancelled.
        self._board.drop(work_label(item.key))
        self._ended(item)

    def _ended(self, item: QueuedWork) -> None:
        """Forget ``item`` (its work ended or never started); free its slot; make the next work of its
        dataset ready."""
        self.running.discard(item.key)
        self.queue.done(item.dataset)
        self._inflight.release()
        self._changed.set()  # the next work of the dataset may be ready; a drain may be over

    def _flight(
        self, work: Work, key: tuple[object, ...], since: float, state: WorkState, **kw: Any
    ) -> InFlight:
        return InFlight(
            work=str(key[0]).lower(),
            dataset=work.dataset,
            job=getattr(work, "job", ""),
            worker=self._worker_id,
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
            self._board.put(label, running)
            try:
                await self._do(work)
                return
            except Fenced:
                raise
            except (TransientError, LockTimeout, LockLost, OutcomeUnknown) as exc:
                error = f"{type(exc).__name__}: {exc}"
                if self._stopping.is_set():
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
                if self._stopping.is_set() or task is None or task.cancelling() > 0:
                    raise
                error = "CancelledError that nobody requested"
                log.exception(
                    "work ended by a cancellation nobody requested; retrying", extra=kv(work=repr(work))
                )
            if self._stopping.is_set():
                return
            retry_at = time.time() + delay
            self._board.put(
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
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, 30.0)


__all__ = ["Scheduler"]
