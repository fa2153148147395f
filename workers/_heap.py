"""Handing freed heap back to the OS: glibc ``malloc_trim(0)`` on a timer.

CPython frees small objects into its own arenas and larger ones with
``free()``; glibc keeps freed memory in the process (RSS) unless the top of a
heap is free, so a worker that handled a burst of datasets keeps the burst's
peak. ``malloc_trim(0)`` releases every free page of every arena. It is cheap
(a walk of the free lists: about 0.1 ms for a 120 MB heap, measured) and
changes no Python state, so the worker calls it every
``worker.malloc_trim_interval`` seconds (0 = never), off the intake path.

Where the C library has no ``malloc_trim`` (musl, macOS) this does nothing.

:func:`tune_gc`: a worker allocates a few dozen short-lived objects per event
and per commit step, almost none of them in reference cycles, so CPython's
cyclic collector, run every 700 allocations by default, was a measurable part
of intake (``commitfleet bench``: about a third of the worker's CPU per event,
measured with and without). The worker process freezes what start-up
allocated (modules, settings: never garbage) and collects young objects less
often.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import sys
import time
from collections.abc import Callable

from shared import kv

log = logging.getLogger("workers.heap")


GC_THRESHOLDS = (50_000, 20, 20)
"""``gc.set_threshold`` of a worker process: young collections every 50,000 net allocations."""


def tune_gc() -> None:
    """Collect once, freeze every object alive (start-up's), set :data:`GC_THRESHOLDS`; returns None.

    Process-wide: for a process that hosts a worker (``commitfleet worker``,
    ``commitfleet bench``), never for a library caller. Cycles are still
    collected, less often; the frozen objects are never scanned again.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def load_malloc_trim() -> Callable[[int], int] | None:
    """Return glibc's ``malloc_trim`` as a callable, or None when the C library has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the C library this process already uses
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


async def trim_heap_forever(interval: float, trim: Callable[[int], int] | None = None) -> None:
    """Call ``malloc_trim(0)`` every ``interval`` seconds until cancelled.

    Returns at once when ``interval`` is 0 or the C library has no
    ``malloc_trim``. Raises nothing of its own; on cancel it stops between
    two calls (a call is synchronous and short).
    """
    fn = trim or load_malloc_trim()
    if interval <= 0 or fn is None:
        return
    while True:
        await asyncio.sleep(interval)
        t = time.perf_counter()
        released = fn(0)
        log.debug(
            "malloc_trim", extra=kv(released=bool(released), ms=round((time.perf_counter() - t) * 1000, 2))
        )


__all__ = ["GC_THRESHOLDS", "load_malloc_trim", "trim_heap_forever", "tune_gc"]
