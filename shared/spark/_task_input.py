"""Inside a Spark task: did this attempt receive its whole partition, and is it still alive?

PySpark gives Python no way to ask whether its task was killed (``TaskContext``
offers ids, properties and resources only), and a killed attempt does not
notice on its own: the executor closes (or half-closes) the socket that feeds
the partition to the Python worker, and PySpark's deserializer takes the end
of the socket for the end of the partition, so the task's code sees a
shortened, often empty, partition and runs to its end.

What tells the two apart is the socket itself. After a partition the JVM sends
``END_OF_DATA_SECTION`` and, in the same write, ``END_OF_STREAM``, then keeps
the socket open while it waits for the task's output: a task that ended
normally finds the socket open (its ``END_OF_STREAM`` waiting either in
Python's buffer or in the kernel). A task whose input was cut finds the socket
at end of file, for good. :func:`input_state` looks with a non-blocking
``MSG_PEEK`` on a duplicate of the descriptor, so nothing is read, consumed or
waited for.

The socket is found on the call stack: the frame of PySpark's ``worker.py``
that runs the task holds it (``input_data_stream`` in PySpark 4, ``infile`` in
3.5). When it cannot be found (another worker layout), the state is
``UNKNOWN`` and the writer refuses to publish (:func:`require_alive`); the
job's preflight runs the same check on the executors first, so such a cluster
fails at job start with one line instead of in every task.
"""

from __future__ import annotations

import enum
import os
import socket
import sys
from types import FrameType
from typing import Any, Final

from .._errors import CommitfleetError, ConfigError

_WORKER_FILE: Final = "pyspark/worker.py"
_STREAM_NAMES: Final = ("input_data_stream", "infile")


class InputState(enum.Enum):
    """What the task's input socket says."""

    OPEN = "open"
    """The executor keeps the socket open: the task is alive (and, once its rows
    are read, received its whole partition)."""
    CLOSED = "closed"
    """The executor closed the socket: the task was killed (or its executor died)."""
    UNKNOWN = "unknown"
    """No PySpark worker socket was found on the call stack."""


class TaskInterrupted(CommitfleetError):
    """Spark killed this task attempt (another attempt won, the job was cancelled, the stage failed).

    Raised inside the task instead of staging or publishing what may be a
    partial partition. Spark discards the attempt anyway.
    """


def state_of_peek(data: bytes | None) -> InputState:
    """Return the state a non-blocking ``MSG_PEEK`` result means (pure).

    ``data`` is what ``recv(n, MSG_PEEK | MSG_DONTWAIT)`` returned, or None when
    it would have blocked (open, nothing pending in the kernel).
    """
    if data is None:
        return InputState.OPEN
    return InputState.OPEN if data else InputState.CLOSED


def find_worker_stream(frame: FrameType | None = None) -> Any | None:
    """Return the file object PySpark's worker reads the task's input from, or None.

    Walks the call stack from ``frame`` (default: the caller) to the frame of
    ``pyspark/worker.py`` that holds the stream.
    """
    f: FrameType | None = frame if frame is not None else sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename.replace(os.sep, "/").endswith(_WORKER_FILE):
            local = f.f_locals
            for name in _STREAM_NAMES:
                stream = local.get(name)
                if stream is not None and hasattr(stream, "fileno"):
                    return stream
        f = f.f_back
    return None


def peek_socket(fd: int) -> InputState:
    """Return the state of socket ``fd`` without reading from it or waiting.

    Works on a duplicate of ``fd``, so the worker's own file object is untouched.
    A descriptor that is not a socket (or is closed) gives ``UNKNOWN``.
    """
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return InputState.UNKNOWN
    try:
        try:
            data: bytes | None = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            data = None
        except ConnectionResetError:
            return InputState.CLOSED
        except OSError:
            return InputState.UNKNOWN
        return state_of_peek(data)
    finally:
        sock.close()


def input_state() -> InputState:
    """Return the state of the current task's input socket (``UNKNOWN`` outside a PySpark worker)."""
    stream = find_worker_stream(sys._getframe(1))
    if stream is None:
        return InputState.UNKNOWN
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return InputState.UNKNOWN
    return peek_socket(fd)


def require_alive(task: int, attempt: int, before: str) -> None:
    """Return when the task attempt is alive; raise when it must not go on to ``before``.

    Called once the partition is read (before staging) and again before
    publishing.

    Raises:
        TaskInterrupted: the executor closed the task's input: Spark killed
            the attempt, and its rows may have been cut short.
        ConfigError: the check is impossible here (no PySpark worker socket
            found), so a partial partition could not be told from a whole one.
    """
    state = input_state()
    if state is InputState.OPEN:
        return
    if state is InputState.CLOSED:
        raise TaskInterrupted(
            f"task {task} attempt {attempt} was killed by Spark (its input was closed); not {before}"
        )
    raise ConfigError(
        "commitfleet cannot tell whether this Spark task received its whole partition: "
        f"no PySpark worker input stream on the call stack (pyspark {_pyspark_version()}); "
        f"not {before}"
    )


def _pyspark_version() -> str:
    try:
        import pyspark

        return str(pyspark.__version__)
    except ImportError:  # pragma: no cover - we run inside pyspark
        return "?"


__all__ = [
    "InputState",
    "TaskInterrupted",
    "find_worker_stream",
    "input_state",
    "peek_socket",
    "require_alive",
    "state_of_peek",
]
