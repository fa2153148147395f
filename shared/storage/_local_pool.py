"""The local store's threads: blocking file calls run here, their answers come back to the event loop.

Why not ``loop.run_in_executor``: each call there costs a concurrent future, a
chained asyncio future and (to wait out a cancel, below) a shield with its
outer future and callbacks. A local commit makes a dozen store calls, each a
few hundred microseconds of file work, so that bookkeeping was a visible part
of a worker's CPU. Here a call is one queue item and one asyncio future, and
the thread hands the answer back with one ``call_soon_threadsafe``.

The pool keeps ``size`` threads, few: every file call gives up the GIL and
takes it back, and threads beyond what the disk keeps busy add that handoff's
CPU, not throughput. But a call must not wait long behind slow ones (big
reads, a stripe held by a frozen process): a lease renewal queued behind them
would run out. So when every thread is busy, a call still queued
:data:`STALL_S` after it was submitted gets a thread of its own, up to
``burst`` threads in all; such a surplus thread ends after :data:`SURPLUS_IDLE_S`
without work.

Calls marked urgent (the store marks those on lock objects) jump the queue:
a free thread takes them before any call queued earlier, so a lease renewal
or a lock release does not wait behind a backlog of quick file calls either.

A call's future cannot be cancelled (:class:`_Pinned`): a thread cannot be
stopped, and a write left running after its caller was cancelled (a holder
whose lease ran out, a crashed commit) could land after the next holder read
what it replaces. So a cancelled caller keeps waiting until its call has
ended, and only then sees the ``CancelledError`` (asyncio re-raises a cancel
requested while a task waited on a future that refused it as soon as that
future is done). File calls are short, so the wait is too.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

T = TypeVar("T")

# A call queued this long while every thread is busy gets a surplus thread.
STALL_S = 0.5
# A surplus thread with no work for this long ends.
SURPLUS_IDLE_S = 2.0

# One queued call: the future to answer, its loop, and the call itself.
_Item = tuple["_Pinned", asyncio.AbstractEventLoop, Callable[[], Any]]
# Queued in place of an urgent call (which waits in the urgent lane): it wakes a thread.
_URGENT: Final = object()


class _Pinned(asyncio.Future[Any]):
    """A future that refuses ``cancel()``: its caller waits for the thread, then is cancelled."""

    taken = False  # set by the thread that takes its call

    def cancel(self, msg: Any | None = None) -> bool:
        return False


class ThreadPool:
    """``size`` daemon threads started on demand, kept until :meth:`close`; up to ``burst`` for stalls."""

    def __init__(self, size: int, name: str, *, burst: int = 32) -> None:
        self._size = size
        self._burst = max(size, burst)
        self._name = name
        self._queue: queue.SimpleQueue[_Item | object | None] = queue.SimpleQueue()
        self._urgent: collections.deque[_Item] = collections.deque()  # taken before the queue
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards _threads (surplus threads remove themselves)
        self._idle = threading.Semaphore(0)  # released by a thread each time it waits for work
        self._closed = False

    async def run(self, call: Callable[[], T], *, urgent: bool = False) -> T:
        """Run ``call()`` on a thread of the pool; ``urgent``: before every call queued earlier.

        Returns:
            What ``call`` returned.

        Raises:
            RuntimeError: the pool is closed.
            Whatever ``call`` raised.

        Cancelled: the call runs on to its end first (see the module doc);
            then ``CancelledError`` is raised and its outcome is dropped.
        """
        if self._closed:
            raise RuntimeError("the local store is closed")
        loop = asyncio.get_running_loop()
        fut = _Pinned(loop=loop)
        if urgent:
            # In its lane first, then the token that wakes a thread: whichever
            # thread takes a token finds the call there (or another took it).
            self._urgent.append((fut, loop, call))
            self._queue.put(_URGENT)
        else:
            self._queue.put((fut, loop, call))
        if not self._idle.acquire(blocking=False) and len(self._threads) < self._size:
            self._start(surplus=False)
        elif len(self._threads) < self._burst:
            # If this call is still queued in a moment, every thread is busy with
            # slow calls: one more takes it. (Set whether or not a thread looked
            # idle: the idle count can be ahead of the threads by a call.)
            timer = loop.call_later(STALL_S, self._grow_if_stalled, fut)
            fut.add_done_callback(lambda _f: timer.cancel())
        try:
            return cast(T, await fut)
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                fut.exception()  # the call's own failure is dropped with it: mark it seen
            raise

    def _start(self, *, surplus: bool) -> None:
        with self._lock:
            thread = threading.Thread(
                target=self._work, args=(surplus,), name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _grow_if_stalled(self, fut: _Pinned) -> None:
        """Start a surplus thread when ``fut``'s call is still queued (runs on the loop)."""
        if not (self._closed or fut.taken or fut.done() or len(self._threads) >= self._burst):
            self._start(surplus=True)

    def close(self) -> None:
        """Let each thread end once the calls already queued are done; nothing new starts. Safe twice."""
        if self._closed:
            return
        self._closed = True
        with self._lock:  # a surplus thread may be ending meanwhile
            count = len(self._threads)
        for _ in range(count):
            self._queue.put(None)

    def _work(self, surplus: bool) -> None:
        while True:
            if not surplus:
                item = self._queue.get()
            else:
                try:
                    item = self._queue.get(timeout=SURPLUS_IDLE_S)
                except queue.Empty:
                    # No work for a while: end, unless a caller already counted on
                    # this thread being idle (took its token): then wait on.
                    if self._idle.acquire(blocking=False):
                        with self._lock:
                            self._threads.remove(threading.current_thread())
                        return
                    continue
            while True:  # urgent calls first, whatever this thread was woken for
                try:
                    urgent = self._urgent.popleft()
                except IndexError:  # none left (another thread may have taken this token's)
                    break
                _run_item(urgent)
                del urgent
            if item is None:
                return
            if item is not _URGENT:
                _run_item(cast(_Item, item))
            del item
            self._idle.release()


def _run_item(item: _Item) -> None:
    """Run one queued call on this thread and hand its answer (or failure) to its loop."""
    fut, loop, call = item
    fut.taken = True
    try:
        result = call()
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller, which re-raises it
        _answer(loop, _fail, fut, exc)
    else:
        _answer(loop, _succeed, fut, result)
        del result  # an idle thread must not keep the last answer alive (a big read's bytes)


def _answer(
    loop: asyncio.AbstractEventLoop,
    how: Callable[[asyncio.Future[Any], Any], None],
    fut: asyncio.Future[Any],
    value: Any,
) -> None:
    try:
        loop.call_soon_threadsafe(how, fut, value)
    except RuntimeError:
        pass  # the loop is closed: nobody waits for this answer any more


def _succeed(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


__all__ = ["ThreadPool"]
