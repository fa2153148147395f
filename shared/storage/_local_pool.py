"""The local store's threads: blocking file calls run here, their answers come back to the event loop.

Why not ``loop.run_in_executor``: each call there costs a concurrent future, a
chained asyncio future and (to wait out a cancel, below) a shield with its
outer future and callbacks. A local commit makes a dozen store calls, each a
few hundred microseconds of file work, so that bookkeeping was a visible part
of a worker's CPU. Here a call is one queue item and one asyncio future, and
the thread hands the answer back with one ``call_soon_threadsafe``.

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
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# One queued call: the future to answer, its loop, and the call itself.
_Item = tuple["asyncio.Future[Any]", asyncio.AbstractEventLoop, Callable[[], Any]]


class _Pinned(asyncio.Future[Any]):
    """A future that refuses ``cancel()``: its caller waits for the thread, then is cancelled."""

    def cancel(self, msg: Any | None = None) -> bool:
        return False


class ThreadPool:
    """Up to ``size`` daemon threads started on demand, kept until :meth:`close`."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # released by a thread each time it waits for work
        self._closed = False

    async def run(self, call: Callable[[], T]) -> T:
        """Run ``call()`` on a thread of the pool.

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
        fut: asyncio.Future[T] = _Pinned(loop=loop)
        self._queue.put((fut, loop, call))
        if not self._idle.acquire(blocking=False) and len(self._threads) < self._size:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                fut.exception()  # the call's own failure is dropped with it: mark it seen
            raise

    def close(self) -> None:
        """Let each thread end once the calls already queued are done; nothing new starts. Safe twice."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fut, loop, call = item
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller, which re-raises it
                _answer(loop, _fail, fut, exc)
            else:
                _answer(loop, _succeed, fut, result)
                del result  # an idle thread must not keep the last answer alive (a big read's bytes)
            del item, fut, call
            self._idle.release()


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
