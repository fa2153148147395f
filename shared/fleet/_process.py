"""How a fleet process (worker, coordinator) waits to start and how it dies.

Start: :func:`wait_until_up` runs one start-up step (check the fleet record in
Redis, register) until it succeeds. While Redis cannot be reached it logs each
wait and tries again after a capped, jittered backoff (:func:`startup_delay`);
a stop request (SIGTERM) ends the wait at once. A bad setting
(:class:`~shared.ConfigError`) is not waited on: it propagates, and the
process exits 2.

Die: :class:`ProcessTasks` holds a process's long-lived tasks (heartbeat,
assignment follower, shard runners; election, event aggregator). Unlike an
``asyncio.TaskGroup``, which cancels the others once and waits (a cancellation
that gets lost leaves the process half alive, and nothing is logged until the
very end), a child that ends with any exception is a *fatal error* of the
process, reported when it happens:

1. the full traceback is logged at once (CRITICAL), with where it happened;
2. the stop event is set and every child is cancelled; the owner's
   ``on_fatal`` hook runs (a worker asks its shard runners to stop, so a lost
   cancellation cannot keep one polling);
3. when ``hard_exit_after`` is set (real processes only, never in-process
   tests), a watchdog thread ends the process with :data:`EXIT_CRASHED` if it
   has not exited that many seconds later, after writing the stack of every
   asyncio task and thread to stderr. Losing nothing this way is the same
   argument as for SIGKILL: messages are acknowledged only once durable,
   and an interrupted commit stays in the WAL for the next owner.

The owner then tears down (:meth:`ProcessTasks.__aexit__` cancels every child
until it has ended) and raises :class:`ProcessCrashed`; the CLI exits
:data:`EXIT_CRASHED`.

Expected per-part errors are not fatal: each part handles its own (a shard
runner that is fenced or set aside ends that shard only, see
``workers/_worker.py``). Code deeper down that starts tasks of its own uses
:class:`ReportingTaskGroup`, so an unexpected error there is reported to the
process when it happens, not when the group finally unwinds.
"""

from __future__ import annotations

import asyncio
import contextvars
import faulthandler
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from .._aio import TaskGroup, cancel_until_done, run_shielded
from .._errors import CommitfleetError, TransientError
from .._logging import kv

log = logging.getLogger("commitfleet.process")

T = TypeVar("T")

EXIT_CRASHED = 70
"""Exit code of a process that ended because of an unexpected error (BSD ``EX_SOFTWARE``)."""

HARD_EXIT_AFTER_S = 5.0
"""Seconds an orderly teardown may take after a fatal error before the process is ended anyway."""

STARTUP_INITIAL_S = 0.5
STARTUP_MAX_S = 5.0

_current: contextvars.ContextVar[ProcessTasks | None] = contextvars.ContextVar(
    "commitfleet_process_tasks", default=None
)


class ProcessCrashed(CommitfleetError):
    """A fleet process ended because of an unexpected error (its ``__cause__``).

    The traceback was logged when the error happened; this only carries the
    news to the process's exit code.
    """


def startup_delay(attempt: int, rng: random.Random, *, initial: float = STARTUP_INITIAL_S) -> float:
    """Return the seconds to wait after failed start-up attempt ``attempt`` (0-based).

    Capped exponential backoff with jitter: uniform in ``[c/2, c]`` where
    ``c = min(STARTUP_MAX_S, initial * 2**attempt)``, so a fleet restarted
    together does not hammer a Redis that is coming back.
    """
    cap = min(STARTUP_MAX_S, initial * 2.0 ** min(attempt, 30))
    return cap / 2 + rng.random() * cap / 2


async def wait_until_up(
    step: Callable[[], Awaitable[T]],
    *,
    stop: asyncio.Event,
    what: str,
    rng: random.Random | None = None,
    initial: float = STARTUP_INITIAL_S,
) -> T | None:
    """Run ``step`` until it succeeds; wait out a TransientError (Redis down) with backoff.

    Each failed attempt is logged (WARNING) with the error and the wait.

    Returns:
        What ``step`` returned, or None when ``stop`` was set first (then
        ``step`` has been cancelled and has ended).

    Raises:
        ConfigError and anything else ``step`` raises other than TransientError.

    Cancellation: ``step`` is cancelled (until it has ended), then the
    cancellation propagates.
    """
    rng = rng or random.Random()
    attempt = 0
    while not stop.is_set():
        task = asyncio.ensure_future(step())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_until_done(stopping)
            if not task.done():
                await cancel_until_done(task)
        if task.cancelled():
            return None  # stopped while the step was under way
        error = task.exception()
        if error is None:
            return task.result()
        if not isinstance(error, TransientError):
            raise error
        delay = startup_delay(attempt, rng, initial=initial)
        attempt += 1
        log.warning(
            "cannot %s yet; waiting before trying again",
            what,
            extra=kv(error=str(error), attempt=attempt, retry_in=round(delay, 2)),
        )
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            continue
    return None


class ProcessTasks:
    """A process's long-lived tasks; any error in one of them is fatal to the process (see the module doc).

    Use as ``async with ProcessTasks(...) as tasks: tasks.start(coro, "where")``.
    Leaving the block cancels every child still running and waits until each
    has ended (shielded: a cancelled owner still leaves no orphan task).
    """

    def __init__(
        self,
        name: str,
        *,
        stop: asyncio.Event,
        on_fatal: Callable[[], None] | None = None,
        hard_exit_after: float | None = None,
    ) -> None:
        self.name = name
        self.stop = stop
        self._on_fatal = on_fatal
        self._hard_exit_after = hard_exit_after
        self._tasks: set[asyncio.Task[Any]] = set()
        self._token: contextvars.Token[ProcessTasks | None] | None = None
        self.crashed: BaseException | None = None
        self.crashed_in = ""

    async def __aenter__(self) -> ProcessTasks:
        self._token = _current.set(self)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await run_shielded(self._cancel_all())
        finally:
            if self._token is not None:
                _current.reset(self._token)

    async def _cancel_all(self) -> None:
        while self._tasks:
            await asyncio.gather(*(cancel_until_done(t) for t in list(self._tasks)))

    def start(self, coro: Coroutine[Any, Any, Any], where: str) -> asyncio.Task[Any]:
        """Start ``coro`` as a child; return its task. Any exception it ends with is fatal."""
        task = asyncio.get_running_loop().create_task(coro, name=where)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.watch(task, where)
        return task

    def watch(
        self, task: asyncio.Future[Any], where: str, *, expected: tuple[type[BaseException], ...] = ()
    ) -> None:
        """Report ``task``'s error as fatal when it ends with one that is not ``expected``.

        In an exception group, only the members that are not ``expected``
        count (an expected error raised alongside a bug does not hide it).
        """

        def done(t: asyncio.Future[Any]) -> None:
            if t.cancelled():
                return
            error = t.exception()
            if error is not None and unexpected(error, expected) is not None:
                self.fatal(error, where)

        task.add_done_callback(done)

    def fatal(self, error: BaseException, where: str) -> None:
        """Report a fatal error: log its traceback now, stop everything, arm the hard exit.

        The first report wins; later ones (often the same error unwinding
        through its parents) are logged at ERROR once each, with traceback.
        """
        if self.crashed is not None:
            if error is not self.crashed and not _contains(error, self.crashed):
                log.error(
                    "another error while the process was ending",
                    exc_info=(type(error), error, error.__traceback__),
                    extra=kv(process=self.name, where=where),
                )
            return
        self.crashed, self.crashed_in = error, where
        log.critical(
            "fatal error in %s: the process ends",
            where,
            exc_info=(type(error), error, error.__traceback__),
            extra=kv(process=self.name, where=where, error=repr(error)),
        )
        if self._hard_exit_after is not None:
            _arm_hard_exit(self.name, self._hard_exit_after, asyncio.get_running_loop())
        self.stop.set()
        for t in list(self._tasks):
            t.cancel()
        if self._on_fatal is not None:
            self._on_fatal()


def current_process() -> ProcessTasks | None:
    """Return the :class:`ProcessTasks` the calling task runs under, if any."""
    return _current.get()


def unexpected(error: BaseException, expected: tuple[type[BaseException], ...]) -> BaseException | None:
    """Return the part of ``error`` that is not ``expected`` (None when all of it is).

    CancelledError always counts as expected. In an exception group the
    members are judged one by one.
    """
    allowed: tuple[type[BaseException], ...] = (asyncio.CancelledError, *expected)
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(lambda e: not isinstance(e, BaseExceptionGroup) and not isinstance(e, allowed))
    return None if isinstance(error, allowed) else error


def _contains(group: BaseException, member: BaseException) -> bool:
    if isinstance(group, BaseExceptionGroup):
        return any(e is member or _contains(e, member) for e in group.exceptions)
    return group.__cause__ is member or group.__context__ is member


class ReportingTaskGroup(TaskGroup):
    """An ``asyncio.TaskGroup`` whose children's unexpected errors reach the process at once.

    Under a :class:`ProcessTasks` (the calling task's context), a child that
    ends with an error that is not ``expected`` is reported as fatal when it
    ends, not when the group unwinds. Elsewhere it is a plain TaskGroup.
    """

    def __init__(
        self, where: str, *, expected: tuple[type[BaseException], ...] = (CommitfleetError,)
    ) -> None:
        super().__init__()
        self._where = where
        self._expected = expected
        self._process = _current.get()

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The body's own error is reported before the group waits for its children:
        # a child whose cancellation gets lost must not hide it.
        if exc is not None and self._process is not None and unexpected(exc, self._expected) is not None:
            self._process.fatal(exc, self._where)
        await super().__aexit__(et, exc, tb)

    def _started(self, task: asyncio.Task[Any]) -> None:
        if self._process is not None:
            self._process.watch(task, self._where, expected=self._expected)


def _arm_hard_exit(name: str, after: float, loop: asyncio.AbstractEventLoop) -> None:
    """Start a daemon thread that ends the process if it is still alive ``after`` seconds from now."""

    def expire() -> None:
        time.sleep(after)
        try:
            sys.stderr.write(
                f"commitfleet: {name} did not end within {after}s of a fatal error; ending it now. Stacks:\n"
            )
            dumped = threading.Event()

            def dump() -> None:
                dump_tasks()
                dumped.set()

            if not loop.is_closed():
                loop.call_soon_threadsafe(dump)
                dumped.wait(1.0)  # a blocked loop cannot dump its tasks: the thread stacks show why
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        finally:
            os._exit(EXIT_CRASHED)

    threading.Thread(target=expire, name="commitfleet-hard-exit", daemon=True).start()


def dump_tasks() -> None:
    """Write every asyncio task's await chain to stderr (on SIGUSR1: what is a stuck process waiting for?)."""
    tasks = asyncio.all_tasks()
    lines = [f"--- {len(tasks)} asyncio tasks ---"]
    for task in tasks:
        lines.append(f"task {task.get_name()}:")
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None:
                lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        if coro is None and lines[-1].startswith("task "):
            lines.append("    (not started or finished)")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


__all__ = [
    "EXIT_CRASHED",
    "HARD_EXIT_AFTER_S",
    "ProcessCrashed",
    "ProcessTasks",
    "ReportingTaskGroup",
    "current_process",
    "dump_tasks",
    "startup_delay",
    "unexpected",
    "wait_until_up",
]
